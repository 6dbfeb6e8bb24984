"""Do pynvml's ctypes structures match the C structures of ``nvml.h``? (issue 13)

A structure that pynvml allocates smaller than the one the library fills is a heap overflow
on every call: the first suspect when NVML corrupts memory. This compiles a small C program
against the ``nvml.h`` of the installed CUDA toolkit (the header of the driver branch in use)
that prints ``sizeof`` and every field's ``offsetof`` of the structures the agent passes to
NVML, and compares them with pynvml's ctypes classes: the importable ``pynvml`` and, with
``--pynvml FILE``, another copy of ``pynvml.py`` (e.g. the version the project pins).

    python3 bench/nvml_abi.py [--cuda /usr/local/cuda] [--pynvml path/to/pynvml.py]

Prints one line per structure and field; exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

#: (C type, pynvml class, fields) of every structure the agent hands to NVML
STRUCTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "nvmlFieldValue_t",
        "c_nvmlFieldValue_t",
        ("fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn", "value"),
    ),
    ("nvmlValue_t", "c_nvmlValue_t", ()),
    (
        "nvmlEventData_t",
        "c_nvmlEventData_t",
        ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId"),
    ),
    (
        "nvmlProcessInfo_t",
        "c_nvmlProcessInfo_v3_t",
        ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"),
    ),
    (
        "nvmlPciInfo_t",
        "nvmlPciInfo_t",
        ("busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId"),
    ),
)


def c_layout(cuda: Path) -> dict[str, int]:
    """``{"T": sizeof, "T.f": offsetof}`` from the header, compiled with gcc."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <nvml.h>", "int main(void) {"]
    for ctype, _, fields in STRUCTS:
        lines.append(f'  printf("{ctype} %zu\\n", sizeof({ctype}));')
        lines += [f'  printf("{ctype}.{f} %zu\\n", offsetof({ctype}, {f}));' for f in fields]
    lines += ['  printf("NVML_API_VERSION %d\\n", NVML_API_VERSION);', "  return 0;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "abi.c"), Path(tmp, "abi")
        src.write_text("\n".join(lines) + "\n")
        gcc = shutil.which("gcc") or shutil.which("cc")
        if gcc is None:
            raise SystemExit("no C compiler (gcc or cc)")
        subprocess.run([gcc, f"-I{cuda / 'include'}", str(src), "-o", str(exe)], check=True)
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def py_layout(module: ModuleType) -> dict[str, int]:
    out: dict[str, int] = {}
    for ctype, pyname, fields in STRUCTS:
        cls = getattr(module, pyname, None)
        if cls is None:
            continue
        out[ctype] = ctypes.sizeof(cls)
        for f in fields:
            descriptor = getattr(cls, f, None)
            if descriptor is not None:
                out[f"{ctype}.{f}"] = descriptor.offset
    return out


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pynvml_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pynvml looks itself up there while loading
    spec.loader.exec_module(module)
    return module


def compare(name: str, c: dict[str, int], py: dict[str, int]) -> int:
    bad = 0
    for key in (k for k in c if k != "NVML_API_VERSION"):
        got = py.get(key)
        ok = got == c[key]
        bad += not ok
        print(f"{'ok  ' if ok else 'DIFF'} {name:<28} {key:<36} header {c[key]:>4}  pynvml {got}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda", type=Path, default=Path("/usr/local/cuda"))
    ap.add_argument("--pynvml", action="append", default=[], help="another pynvml.py to check")
    args = ap.parse_args()
    c = c_layout(args.cuda)
    print(f"# nvml.h of {args.cuda.resolve()}: NVML_API_VERSION {c['NVML_API_VERSION']}")
    import pynvml

    bad = compare(f"pynvml ({Path(pynvml.__file__).parent.name})", c, py_layout(pynvml))
    for path in args.pynvml:
        bad += compare(f"pynvml ({path})", c, py_layout(load(path)))
    print(f"# {bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
