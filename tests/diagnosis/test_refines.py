"""A root named more exactly (rules.yaml `refines`), end to end from log text: the frame of a
traceback says what the program was doing, another reading of the root's line says more."""

from __future__ import annotations

from denpex.catalog import load_catalog
from denpex.lite.session import LiteSession, ReportOptions


def diagnose(text: str, exit_code: int | None = 1) -> dict:
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    session.scanner.stream("train.log")
    session.scanner.feed("train.log", text.encode())
    return session.conclude(exit_code, None).to_dict()


DCP_LOAD = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/train.py", line 88, in <module>
[rank0]:     dcp.load(state_dict, checkpoint_id="/ckpt/step-15000")
[rank0]:   File "/usr/lib/python3/site-packages/torch/distributed/checkpoint/state_dict_loader.py", line 182, in load
[rank0]:     _load_state_dict(state_dict, storage_reader, process_group, coordinator_rank, no_dist, planner)
[rank0]:   File "/usr/lib/python3/site-packages/torch/distributed/checkpoint/utils.py", line 210, in reduce_scatter
[rank0]:     raise result
[rank0]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])
"""

TORCH_SAVE = """\
Epoch 0, average loss 0.0506
Traceback (most recent call last):
  File "/src/train.py", line 227, in train
    torch.save({'model_state_dict': network.state_dict()}, path)
  File "/env/lib/python3.9/site-packages/torch/serialization.py", line 422, in save
    with _open_zipfile_writer(f) as opened_zipfile:
  File "/env/lib/python3.9/site-packages/torch/serialization.py", line 309, in _open_zipfile_writer
    return container(name_or_buffer)
OSError: [Errno 9] Bad file descriptor
"""


def test_dcp_exception_under_dcp_load_is_a_failed_load():
    root = diagnose(DCP_LOAD)["root_cause"]
    assert (root["category"], root["rule"], root["rank"]) == (
        "ckpt.load_failure",
        "named_by_frame",
        0,
    )


def test_a_bare_exception_inside_torch_save_is_a_failed_save_at_the_exception_line():
    diagnosis = diagnose(TORCH_SAVE)
    root = diagnosis["root_cause"]
    assert (root["category"], root["rule"]) == ("ckpt.save_failure", "named_by_frame")
    assert root["signature"] == "ckpt.save_failure.frame_torch_save"
    first = next(t for t in diagnosis["timeline"] if t["id"] == root["evidence"][0])
    assert first["line"].startswith("OSError: [Errno 9]") and first["lineno"] == 9
    assert diagnosis["findings"] == []


def test_the_same_traceback_without_the_save_frame_stays_a_bare_exception():
    text = "\n".join(line for line in TORCH_SAVE.splitlines() if "serialization.py" not in line)
    assert diagnose(text)["root_cause"]["category"] == "app.exception"


def test_enospc_on_dev_shm_is_shared_memory():
    line = (
        "node1:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
        "/dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)\n"
    )
    assert diagnose(line)["root_cause"]["category"] == "host.shm_exhausted"


UNKNOWN_MODEL_TYPE = """\
Traceback (most recent call last):
  File "/src/sft/finetune.py", line 344, in train
    config = transformers.AutoConfig.from_pretrained(
  File "/env/lib/python3.10/site-packages/transformers/models/auto/configuration_auto.py", line 1022, in from_pretrained
    config_class = CONFIG_MAPPING[config_dict["model_type"]]
  File "/env/lib/python3.10/site-packages/transformers/models/auto/configuration_auto.py", line 723, in __getitem__
    raise KeyError(key)
KeyError: 'mistral'
"""


def test_a_keyerror_raised_looking_up_a_model_type_is_a_too_old_transformers():
    root = diagnose(UNKNOWN_MODEL_TYPE)["root_cause"]
    assert (root["category"], root["rule"]) == ("env.version_mismatch", "named_by_frame")


def test_a_keyerror_of_ones_own_code_stays_a_bare_exception():
    text = "\n".join(line for line in UNKNOWN_MODEL_TYPE.splitlines() if "__getitem__" not in line)
    assert diagnose(text)["root_cause"]["category"] == "app.exception"


def test_an_import_error_that_names_a_wrong_version_is_a_version_mismatch():
    line = (
        "ImportError: tokenizers>=0.11.1,!=0.11.3,<0.14 is required for a normal functioning "
        "of this module, but found tokenizers==0.14.0.\n"
    )
    root = diagnose(line)["root_cause"]
    assert (root["category"], root["signature"]) == (
        "env.version_mismatch",
        "env.version_mismatch.transformers_require_version",
    )


def test_a_library_asking_for_a_missing_package_is_an_import_error():
    line = (
        "ImportError: Using the `Trainer` with `PyTorch` requires `accelerate>=0.20.1`: Please "
        "run `pip install transformers[torch]` or `pip install accelerate -U`\n"
    )
    assert diagnose(line)["root_cause"]["category"] == "env.import_error"


NCCL_LAST_ERROR = """\
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.6
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
socketStartConnect: Connect to 10.1.2.3<52822> failed : Connection refused
"""


def test_the_reason_under_nccls_last_error_names_its_system_error():
    root = diagnose(NCCL_LAST_ERROR)["root_cause"]
    assert (root["category"], root["signature"]) == (
        "net.socket_error",
        "net.socket_error.connect_failed",
    )


def test_a_socket_error_of_another_message_further_down_is_not_its_reason():
    text = NCCL_LAST_ERROR.replace("Last error:\n", "Last error:\n" + "step 1\n" * 6)
    assert diagnose(text)["root_cause"]["category"] == "nccl.system_error"


NCCL_TOPOLOGY = """\
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, internal error - please report this issue to the NCCL developers, NCCL version 2.14.3
[rank3]: ncclInternalError: Internal check failed.
[rank3]: Last error:
[rank3]: Failed to find reverse path from remNode 0/41000 nlinks 2 to node 0/61000
"""


def test_a_topology_this_nccl_cannot_read_names_its_internal_error():
    root = diagnose(NCCL_TOPOLOGY)["root_cause"]
    assert (root["category"], root["rank"]) == ("env.version_mismatch", 3)
