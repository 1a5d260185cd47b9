"""Issue 35: one device decision (trainer/device.py), seen by every place that loads the target; generators on
the device they draw for; the KV cache passed under the name the installed transformers takes; the greedy gate's
reference written down. Runs on a CPU: GPU plans are resolved with a stated GPU count, never run."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from click.testing import CliRunner
from drafters import random_drafter
from tiny_targets import make_tiny_target

import trainer.audit
import trainer.targets
from draftsmith.cli import main as cli
from schemas.audit import AuditSpec, resolved
from schemas.compute import combine_device_settings
from schemas.job_spec import JobSpec
from schemas.sampling import SamplingParams
from schemas.validation_plan import timed_prompt_count, validation_tokens
from trainer.device import DeviceUnavailable, resolve_device, synchronize
from trainer.errors import TargetError
from trainer.pipeline import Launch, Layout, RunConfig, StageHooks, job_device_plan, open_job
from trainer.sampling import check_generator, rejection_sample, sample, seeded_generator
from trainer.speculative import SpeculativeDecoder
from trainer.targets.loading import Target, cache_argument, load_target
from trainer.validation.report import greedy_gate

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


# --- the decision -------------------------------------------------------------------------------------------


def test_auto_is_the_cpu_in_float32_on_this_machine():
    plan = resolve_device()
    assert (plan.device, plan.dtype, plan.name, plan.count) == (torch.device("cpu"), torch.float32, "cpu", 1)
    assert resolve_device("auto", "float32").dtype == torch.float32
    assert resolve_device("cpu", worker="cpu").describe() == {"setting": "cpu", "device": "cpu", "type": "cpu",
                                                             "name": "cpu", "count": 1, "dtype": "float32"}


@pytest.mark.parametrize("setting", ["cuda", "cuda:0"])
def test_cuda_on_a_cpu_machine_is_refused_naming_device(setting):
    with pytest.raises(DeviceUnavailable, match=rf"device '{setting}' needs a GPU.*set device to auto or cpu"):
        resolve_device(setting, cuda_devices=0)


def test_gpu_plans_bfloat16_unless_float32_and_parse_cuda_n():
    auto = resolve_device("auto", cuda_devices=4)
    assert (auto.device, auto.dtype, auto.count) == (torch.device("cuda", 0), torch.bfloat16, 4)
    pinned = resolve_device("cuda:2", "float32", cuda_devices=4)
    assert (pinned.device, pinned.dtype, pinned.count) == (torch.device("cuda", 2), torch.float32, 1)
    assert resolve_device("CUDA:3", cuda_devices=4).device == torch.device("cuda", 3)
    with pytest.raises(DeviceUnavailable, match="shows 4 GPU"):
        resolve_device("cuda:4", cuda_devices=4)
    with pytest.raises(DeviceUnavailable, match="is not a device"):
        resolve_device("gpu")
    assert resolve_device("cpu", cuda_devices=4).dtype == torch.float32  # the CPU is float32 whatever is asked


def test_the_job_says_what_it_needs_the_worker_what_it_has():
    assert combine_device_settings("auto", "cuda:1") == "cuda:1"
    assert combine_device_settings("cuda", "auto") == "cuda"
    assert combine_device_settings("cuda", "cuda:1") == "cuda:1"
    assert combine_device_settings("cuda:1", "cuda") == "cuda:1"
    assert combine_device_settings("cpu", "cuda") == "cpu"  # every worker has a CPU
    with pytest.raises(ValueError, match="job's device 'cuda' conflicts with this worker's DRAFTSMITH_WORKER_DEVICE"):
        combine_device_settings("cuda", "cpu")
    with pytest.raises(DeviceUnavailable, match="conflicts"):
        resolve_device("cuda:0", worker="cuda:1", cuda_devices=2)


def test_training_ranks_take_their_own_gpu_of_the_plan():
    plan = resolve_device("cuda", cuda_devices=2)
    assert plan.for_rank(0).device == torch.device("cuda", 0)
    assert resolve_device("cpu").for_rank(3).device == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match="names one GPU"):
        resolve_device("cuda:1", cuda_devices=2).for_rank(1)


def test_the_setting_is_validated_where_it_is_given():
    with pytest.raises(ValueError, match=r"compute.device 'gpu' is not a device; use auto"):
        JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}, "compute": {"device": "gpu"}})
    spec = JobSpec.model_validate({"target": {"uri": "bundled:smollm2-135m"}})
    assert "compute" not in json.loads(spec.canonical_json())  # jobs stored before the field keep their hash
    from domain.settings import Settings

    with pytest.raises(ValueError, match="DRAFTSMITH_WORKER_DEVICE 'cuda:x' is not a device"):
        Settings(env="development", worker_device="cuda:x")
    assert Settings(env="development", worker_device="cuda:1").worker_device == "cuda:1"


# --- every loader receives the plan -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("device-target"), "qwen3")


@pytest.fixture
def loads(monkeypatch):
    """Every target load, as (device, dtype): the loader that the pipeline, the audit and the CLI import."""
    seen: list[tuple[torch.device, torch.dtype]] = []

    def recording(path, *, device="cpu", dtype=None, **options):
        seen.append((torch.device(device), dtype))
        return load_target(path, device=device, dtype=dtype, **options)

    monkeypatch.setattr(trainer.targets, "load_target", recording)
    return seen


def test_every_stage_loads_the_target_with_the_jobs_plan_and_says_so(loads, tiny_dir, tmp_path):
    events = []
    hooks = StageHooks(progress=lambda stage, fraction, detail: events.append((stage, detail)))
    config = RunConfig(target=str(tiny_dir), device="cpu", dtype="float32")
    job = open_job(config, Layout.under(tmp_path / "work", tmp_path / "out"), hooks, Launch(device="auto"))
    job.stage = "prepare"
    assert job.target.device == torch.device("cpu") and job.target.dtype == torch.float32
    assert loads == [(torch.device("cpu"), torch.float32)]
    assert events == [("prepare", "loading the target on cpu (cpu, float32)")]
    # A training rank resolves the same plan from the launch file (trainer/training/launch.py) ...
    assert job_device_plan(config, "auto").for_rank(0) == job.plan
    # ... and a job asking for a GPU on this CPU-only machine fails before any work, naming `device`.
    refused = open_job(RunConfig(target=str(tiny_dir), device="cuda"), job.layout, hooks, Launch())
    with pytest.raises(DeviceUnavailable, match="device 'cuda' needs a GPU"):
        refused.target  # noqa: B018 (the property raises)
    worker_cpu = open_job(RunConfig(target=str(tiny_dir), device="cuda"), job.layout, hooks, Launch(device="cpu"))
    with pytest.raises(DeviceUnavailable, match="DRAFTSMITH_WORKER_DEVICE='cpu'"):
        worker_cpu.target  # noqa: B018 (the property raises)


def test_the_audit_and_the_cli_load_with_the_plan(loads, tiny_dir, monkeypatch):
    seen = {}
    monkeypatch.setattr(trainer.audit, "audit_drafter",
                        lambda target, *args, device_plan=None, **kwargs: seen.setdefault("plan", device_plan))
    spec = resolved(AuditSpec(drafter="drf_01JQ3ZV8Q7M3W0S9X4T2B6N1C5", target={"uri": "bundled:smollm2-135m"}))
    trainer.audit.run_audit(spec, target=str(tiny_dir), drafter="unused", device="cpu", dtype="float32")
    assert loads == [(torch.device("cpu"), torch.float32)] and seen["plan"].describe()["dtype"] == "float32"

    result = CliRunner().invoke(cli, ["target", "inspect", str(tiny_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert loads[-1] == (torch.device("cpu"), torch.float32)
    refused = CliRunner().invoke(cli, ["target", "inspect", str(tiny_dir), "--device", "gpu0"])
    assert refused.exit_code == 2 and "--device 'gpu0' is not a device" in refused.output


def test_draftsmith_run_puts_device_in_the_job_spec(monkeypatch, tmp_path):
    import trainer.pipeline

    seen = {}
    monkeypatch.setattr(trainer.pipeline.Run, "execute", lambda self, resume=False: seen.setdefault("config", self.config)
                        and (_ for _ in ()).throw(SystemExit(0)))
    CliRunner().invoke(cli, ["run", "--target", "smollm2-135m", "--out", str(tmp_path / "a"), "--device", "cuda:1",
                             "--dtype", "float32"])
    assert (seen["config"].device, seen["config"].dtype) == ("cuda:1", "float32")


# --- generators ---------------------------------------------------------------------------------------------


def test_the_seeded_generator_is_todays_on_the_cpu_and_a_foreign_one_is_refused():
    today = torch.Generator().manual_seed(7)
    assert torch.equal(torch.rand(8, generator=seeded_generator(7)), torch.rand(8, generator=today))
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.equal(sample(probs, seeded_generator(3, "cpu")), sample(probs, torch.Generator().manual_seed(3)))
    with pytest.raises(ValueError, match=r"generator on cpu cannot draw on cuda:0.*seeded_generator\(seed, 'cuda:0'"):
        check_generator(torch.Generator(), torch.device("cuda", 0))
    drafts, q = torch.tensor([1, 2]), probs[:2]
    assert rejection_sample(drafts, probs, q, seeded_generator(1)) == rejection_sample(
        drafts, probs, q, torch.Generator().manual_seed(1))
    synchronize("cpu")  # nothing to wait for, and no error


# --- the transformers cache argument ------------------------------------------------------------------------


def test_the_cache_goes_under_the_name_the_installed_forward_takes(tiny_dir):
    class Old:  # transformers 5.17: past_key_values, and **kwargs that would swallow `cache` in silence
        def forward(self, input_ids, past_key_values=None, use_cache=None, **kwargs): ...

    class New:
        def forward(self, input_ids, cache=None, use_cache=None, **kwargs): ...

    class Neither:
        def forward(self, input_ids, **kwargs): ...

    assert (cache_argument(Old()), cache_argument(New())) == ("past_key_values", "cache")
    with pytest.raises(TargetError, match="takes no KV cache argument"):
        cache_argument(Neither())

    target = load_target(tiny_dir)
    assert target.cache_argument in inspect.signature(target.model.forward).parameters
    real, calls = target.model, []

    class OldModel(torch.nn.Module):  # the real model behind a 5.17-style signature
        def __init__(self):
            super().__init__()
            self.inner = real
            self.config = real.config

        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            calls.append(past_key_values)
            return real(input_ids=input_ids, cache=past_key_values, **kwargs)

        def get_decoder(self):
            return real.get_decoder()

    old = Target(OldModel(), target.tokenizer, target.path)
    assert old.cache_argument == "past_key_values"
    cache = target.new_cache()
    old.forward(torch.tensor([[5, 6, 7]]), cache=cache)
    assert calls == [cache] and cache.get_seq_length() == 3


# --- the greedy gate ----------------------------------------------------------------------------------------


def test_the_verify_shaped_reference_is_the_plain_decode_in_float32_and_recorded(tiny_dir):
    target = load_target(tiny_dir)
    plain, shaped = SpeculativeDecoder(target), SpeculativeDecoder(target, verify_width=8)
    for prompt in ([5, 9, 11], [7] * 13):
        assert shaped.generate(prompt, GREEDY, stop_token_ids=[]).tokens == plain.generate(
            prompt, GREEDY, stop_token_ids=[]).tokens
    gate = greedy_gate(target, 4, 4, every_prompt=False)
    assert (gate["dtype"], gate["verify_width"], gate["every_prompt"]) == ("float32", 1, False)
    bf16 = load_target(tiny_dir, dtype=torch.bfloat16)
    assert greedy_gate(bf16, 4, 12, every_prompt=True)["verify_width"] == 4
    drafter = random_drafter(bf16, "dflash2", block_size=4)
    assert len(SpeculativeDecoder(bf16, drafter).generate([5, 9], GREEDY, stop_token_ids=[]).tokens) == 24


def test_validation_counts_its_tokens_by_the_gate():
    today = validation_tokens(12, 64, 300)
    assert today.batch_one == 2 * timed_prompt_count(12) * 64
    gpu_bf16 = validation_tokens(12, 64, 300, every_prompt=True, shaped_reference=True)
    assert gpu_bf16.batch_one == (2 * 12 + timed_prompt_count(12)) * 64
