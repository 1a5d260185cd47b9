"""Issue 35 part 4: the GPU check's offline bundle (bench/gpu_bundle.py) is cut into parts under the transfer limit,
and reassembled only when every part matches the manifest's sha256s."""

from __future__ import annotations

import json
import os

import pytest

from bench import gpu_bundle


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "stage"
    (src / "wheels").mkdir(parents=True)
    (src / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(os.urandom(5000))
    (src / "wheels" / "b-2.0-py3-none-any.whl").write_bytes(os.urandom(1234))
    (src / "requirements.txt").write_text("a==1.0\nb==2.0\n")
    return src


def test_parts_stay_under_the_limit_and_reassemble_byte_for_byte(source, tmp_path):
    manifest = json.loads(gpu_bundle.pack(source, tmp_path / "parts", part_bytes=2048).read_text())
    assert len(manifest["parts"]) >= 4 and all(part["bytes"] <= 2048 for part in manifest["parts"])
    assert sum(part["bytes"] for part in manifest["parts"]) == manifest["archive"]["bytes"]
    assert set(manifest["files"]) == {"requirements.txt", "wheels/a-1.0-py3-none-any.whl", "wheels/b-2.0-py3-none-any.whl"}
    dest = gpu_bundle.assemble(tmp_path / "parts", tmp_path / "out")
    for name in manifest["files"]:
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert not (dest / "bundle.tar").exists()
    assert gpu_bundle.PART_BYTES < 60_000_000 and gpu_bundle.PART_BYTES + 2**20 < 64 * 2**20


def test_a_corrupt_or_missing_part_is_refused_naming_it(source, tmp_path):
    parts = tmp_path / "parts"
    gpu_bundle.pack(source, parts, part_bytes=2048)
    second = parts / "bundle.tar.part001"
    data = bytearray(second.read_bytes())
    data[10] ^= 0xFF
    second.write_bytes(bytes(data))
    with pytest.raises(gpu_bundle.BundleError, match="bundle.tar.part001: sha256 or size differs"):
        gpu_bundle.assemble(parts, tmp_path / "out")
    assert gpu_bundle.main(["verify", str(parts)]) == 1
    second.unlink()
    with pytest.raises(gpu_bundle.BundleError, match="bundle.tar.part001 is missing"):
        gpu_bundle.verify(parts)


def test_parts_out_of_order_fail_the_archive_check(source, tmp_path):
    parts = tmp_path / "parts"
    path = gpu_bundle.pack(source, parts, part_bytes=2048)
    manifest = json.loads(path.read_text())
    manifest["parts"][0], manifest["parts"][1] = manifest["parts"][1], manifest["parts"][0]
    path.write_text(json.dumps(manifest))
    with pytest.raises(gpu_bundle.BundleError, match="out of order"):
        gpu_bundle.assemble(parts, tmp_path / "out")


def test_the_bundle_lists_what_the_gpu_image_lacks():
    names = {requirement.split("==")[0] for requirement in gpu_bundle.REQUIREMENTS}
    assert {"transformers", "pydantic", "scipy", "gguf", "safetensors", "tokenizers", "click"} <= names
    assert not names & {"torch", "triton"}  # the image's CUDA builds run it (the bundle goes on PYTHONPATH)
    assert "transformers==5.24.0" in gpu_bundle.REQUIREMENTS


def test_the_image_s_torch_triton_and_cuda_libraries_never_enter_the_bundle():
    """pip resolves accelerate and peft to a torch; bundled, it would shadow the image's CUDA build on PYTHONPATH
    (the rehearsal found torch 2.7.1+cu126 and 3.2 GB of wheels in a bundle meant to be tens of MB)."""
    for name in ("torch", "triton", "nvidia-cublas-cu12", "nvidia_cudnn_cu12", "cuda-bindings", "sympy", "jinja2"):
        assert not gpu_bundle.bundled(name), name
    for name in ("transformers", "accelerate", "peft", "pyarrow", "pydantic", "pydantic-core", "gguf", "scipy"):
        assert gpu_bundle.bundled(name), name
