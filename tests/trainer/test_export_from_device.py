"""GGUF export with the target's LM head still on the GPU: the draft-vocabulary rows and `d2t` are copied to the
host before numpy reads them (trainer/export/gguf_writer.py). A tensor that refuses `.numpy()` until copied to the
host, as a CUDA tensor does, stands in for the GPU."""

from __future__ import annotations

import pytest
import torch

from trainer.drafter.checkpoint import save_drafter
from trainer.drafter.config import DrafterConfig
from trainer.drafter.model import Drafter
from trainer.export.gguf_writer import write_gguf


class OnDevice(torch.Tensor):
    """Behaves like a tensor on an accelerator: `.numpy()` refuses, `.cpu()` gives a plain host tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.numpy:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func is torch.Tensor.cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].clone()
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from tiny_targets import make_bpe_target

    from trainer.targets import load_target

    root = tmp_path_factory.mktemp("export-device")
    target_dir = make_bpe_target(root / "target", hidden_size=64, num_layers=4)
    target = load_target(target_dir)
    config = DrafterConfig.for_target(target, variant="dflash2", num_layers=1, block_size=4, mask_token_id=3,
                                      target_layer_ids=[1, 2], selector_rank=32, selector_top_k=4)
    save_drafter(Drafter(config), root / "drafter")
    return root / "drafter", target_dir, target.vocab_size


def test_the_stand_in_refuses_numpy_like_a_gpu_tensor():
    on_device = torch.arange(4.0).as_subclass(OnDevice)
    with pytest.raises(TypeError, match="cpu"):
        on_device[1:].detach().to(torch.float32).numpy()
    assert on_device.detach().cpu().numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_draft_vocabulary_export_reads_a_head_and_ids_on_the_device(dirs, tmp_path):
    drafter_dir, target_dir, vocab = dirs
    ids = torch.tensor([0, 5, 17, 300, 4096, vocab - 1])
    head = torch.randn(vocab, 64, generator=torch.Generator().manual_seed(0))
    on_host = write_gguf(drafter_dir, target_dir, tmp_path / "host.gguf", "q8_0", draft_vocab=(ids, head))
    on_device = write_gguf(drafter_dir, target_dir, tmp_path / "device.gguf", "q8_0",
                           draft_vocab=(ids.as_subclass(OnDevice), head.as_subclass(OnDevice)))
    assert on_device.read_bytes() == on_host.read_bytes()
