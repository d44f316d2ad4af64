"""The text corpus the tokenizer oracle tests share: many scripts, code,
whitespace runs, numbers, special-token look-alikes, and a ~1 MB document."""
import random

CORPUS = [
    "",
    " ",
    "Hello world!",
    "Hello, World! How are you doing today?",
    "  leading and trailing spaces  ",
    "tabs\tand\t\ttabs\n\nnewlines\r\nwindows\rcarriage",
    "    four spaces\n        eight spaces\n\t\t\ttabs",
    "\n\n\n\n",
    "a  b   c    d     e",
    "It's they're we've I'm you'll he'd IT'S THEY'RE",
    "Numbers: 1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 0x1F",
    "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
    "数字123456789 and 中文字符，还有标点。「引号」",
    "日本語のテキスト、カタカナとひらがな。漢字も。",
    "한국어 텍스트입니다. 안녕하세요!",
    "العربية: مرحبا بالعالم! كيف حالك؟",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है।",
    "ภาษาไทย: สวัสดีชาวโลก ทดสอบการตัดคำ",
    "Русский текст: Привет, мир! Ёжик.",
    "Ελληνικά: Γειά σου Κόσμε",
    "Tiếng Việt: Xin chào thế giới, đây là một bài kiểm tra.",
    "emoji 😀 👍🏽 🇫🇷 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 done",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308 \u0041\u030a Z\u0335\u0321\u0322",
    "precomposed vs decomposed: café cafe\u0301 Å A\u030a ﬁ ﬀ ①②③ ｆｕｌｌｗｉｄｔｈ",
    "zero width: a\u200bb\u200cc\u200dd\ufeffe",
    "odd spaces: a\u00a0b\u2003c\u3000d\u0085e\u2028f\u2029g\u1680h\u202fi",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const x = {a: [1, 2, 3], 'b': \"str\", c: null}; // comment\n/* block */",
    "<html><body><div class=\"x\">Text &amp; more</div></body></html>",
    "SELECT * FROM users WHERE id = 1 AND name LIKE '%smith%';",
    "https://example.com/path?query=1&other=two#frag user@example.org",
    "!!!???...,,,;;;:::---___===+++***&&&^^^%%%$$$###@@@~~~```'''\"\"\"",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "<|endoftext|><|endoftext|>text<|endoftext|>",
    "<think>reasoning</think> answer",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "look-alikes: <|im_start |> <| im_start|> <|im_star <im_start> |im_start| <bos <eos> < bos>",
    "<|reserved_special_token_5|> <unused0> <pad> <mask> [CLS] [SEP] [UNK]",
    "Mixed: English中文العربيةहिन्दी😀123abc",
    "CamelCaseWordsAndSHOUTINGwords and_snake_case and kebab-case",
    "ſ ß ẞ İstanbul ı K Å ﬃ",
    "a" * 300,
    " " * 100 + "x",
    "\t" * 40 + "\n" * 40,
    "🙂" * 50,
    "word " * 100,
]


def big_document(size=1 << 20, seed=0):
    """A deterministic mix of the corpus and random words, about `size` bytes."""
    rng = random.Random(seed)
    words = [w for text in CORPUS for w in text.split(" ") if w]
    parts, n = [], 0
    while n < size:
        if rng.random() < 0.05:
            piece = rng.choice(CORPUS)
        else:
            piece = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            piece += rng.choice([" ", "\n", "\n\n", ". ", ", ", "\t"])
        parts.append(piece)
        n += len(piece.encode())
    return "".join(parts)
