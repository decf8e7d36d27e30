"""Write the ONNX models written in ONNX's textual syntax in a lit test file as .onnx files.

    %python %S/Inputs/onnx_text.py %s %t    ->    %t.0.onnx, %t.1.onnx, ...

Lines starting with `//` (RUN and CHECK lines) are dropped; `// -----` separates models, which
are numbered from 0 in the order they appear. The syntax is onnx.parser's (docs/Syntax.md of
ONNX): `<ir_version: 10, opset_import: ["" : 18]> name (float[2,3] x) => (float[2] y) {...}`.
Models are written as parsed, unchecked: the importer's own checks are what tests look at.
"""

from __future__ import annotations

import sys

import onnx
import onnx.parser


def models(text: str) -> list[str]:
    chunks, lines = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("// -----"):
            chunks.append("\n".join(lines))
            lines = []
        elif not stripped.startswith("//"):
            lines.append(line)
    chunks.append("\n".join(lines))
    return [c for c in chunks if c.strip()]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: onnx_text.py TEST_FILE OUT_PREFIX", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        text = f.read()
    for i, chunk in enumerate(models(text)):
        onnx.save(onnx.parser.parse_model(chunk), f"{argv[2]}.{i}.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
