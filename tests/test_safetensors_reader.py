"""A safetensors header is read by safetensors itself (issue 37): ``safetensors_shapes`` through ``safe_open``,
every malformation one ``UserError`` line; ``safetensors_header_bytes`` gives the stored header for digests."""

import json
import struct

import pytest
import torch
from safetensors.torch import save

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import SAFETENSORS_HEADER_MAX_BYTES, safetensors_header_bytes, safetensors_shapes

VALID = save({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, metadata={"note": "x"})
(LENGTH,) = struct.unpack("<Q", VALID[:8])
HEADER, DATA = json.loads(VALID[8 : 8 + LENGTH]), VALID[8 + LENGTH :]


def with_header(header: object, data: bytes = DATA) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def test_shapes_of_a_valid_file_and_its_stored_header(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(VALID)
    assert safetensors_shapes(path) == {"a": (3, 4), "b": (5,)}
    assert safetensors_header_bytes(path) == VALID[: 8 + LENGTH]
    assert json.loads(safetensors_header_bytes(path)[8:])["__metadata__"] == {"note": "x"}


@pytest.mark.parametrize(
    "payload, problem",
    [
        (VALID + b"trailing", "not fully covered"),  # the data covered exactly, as safetensors writes it
        (with_header({**HEADER, "a": {**HEADER["a"], "dtype": "X99"}}), "unknown variant"),  # no such dtype
        (with_header({**HEADER, "b": {**HEADER["b"], "data_offsets": [52, 72]}}, DATA + bytes(4)), "invalid"),  # a gap
        (with_header({**HEADER, "a": {**HEADER["a"], "shape": [10**12, 10**6]}}), "overflow"),
        (struct.pack("<Q", 1 << 62) + VALID[8:], "header too large"),
        (b"short", "header too small"),
        (with_header([1, 2]), "invalid JSON"),  # a list, not an object
    ],
)
def test_a_malformed_file_is_one_line_naming_it(tmp_path, payload, problem):
    path = tmp_path / "w.safetensors"
    path.write_bytes(payload)
    with pytest.raises(UserError, match=f"{path} is not a valid safetensors file .*{problem}") as error:
        safetensors_shapes(path)
    assert "\n" not in str(error.value)


def test_header_bytes_are_none_for_a_short_file_or_an_oversized_claim(tmp_path):
    path = tmp_path / "w.safetensors"
    for payload in (b"short", struct.pack("<Q", SAFETENSORS_HEADER_MAX_BYTES + 1) + VALID[8:], VALID[: 8 + LENGTH - 1]):
        path.write_bytes(payload)
        assert safetensors_header_bytes(path) is None
    with pytest.raises(UserError, match="cannot read"):
        safetensors_header_bytes(tmp_path / "missing.safetensors")
