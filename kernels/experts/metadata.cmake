# Writes a kernel package's metadata.json beside its library: the
# package's identity and each file's sha256 (docs/kernels.md). Run with
# -DLIB=<library> -DOUT=<metadata.json> -DVARIANT=<variant>.
file(SHA256 ${LIB} digest)
get_filename_component(name ${LIB} NAME)
file(WRITE ${OUT} "{\n"
  "  \"id\": \"hubrt/experts-grouped\",\n"
  "  \"name\": \"experts\",\n"
  "  \"version\": 1,\n"
  "  \"license\": \"Apache-2.0\",\n"
  "  \"backend\": \"cpu\",\n"
  "  \"abi\": 1,\n"
  "  \"variant\": \"${VARIANT}\",\n"
  "  \"files\": {\"${name}\": {\"sha256\": \"${digest}\"}}\n"
  "}\n")
