"""Text that must come through every cleaning of one-line names exactly as it went in
(tether/visible_text.py): scripts written right to left, joiners that join something
(emoji sequences, Persian, Devanagari), CJK with its own space. Shared by the title, import
and page tests."""

FAMILY = "family \U0001f468\u200d\U0001f469\u200d\U0001f467"
PERSIAN = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0645"
LEGITIMATE = {
    "arabic": "مرحبا بالعالم",
    "hebrew": "שלום עולם (draft 2)",
    "family emoji (ZWJ)": FAMILY,
    "rainbow flag (VS16 + ZWJ)": "\U0001f3f3\ufe0f\u200d\U0001f308 pride",
    "Scotland flag (tag sequence)": "\U0001f3f4"
    + "".join(chr(0xE0000 + ord(c)) for c in "gbsct")
    + "\U000e007f",
    "persian (ZWNJ)": PERSIAN,
    "devanagari (ZWJ after virama)": "\u0915\u094d\u200d\u0937 शिक्षा",
    "CJK with an ideographic space": "東京\u3000大阪 日本語",
    "mixed Hebrew and Latin": "Notes על Tether",
}
