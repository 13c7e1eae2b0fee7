"""HCCL's return codes and error messages, mapped to what usually causes them on a multi-node Atlas cluster.

The numbers are HCCL's `HcclResult` enum (hccl_types.h; documented in hicann/hccl docs/api/context/HcclResult.md):
0 success, 1 HCCL_E_PARA, 2 HCCL_E_PTR, 3 HCCL_E_MEMORY, 4 HCCL_E_INTERNAL, 5 HCCL_E_NOT_SUPPORT, 6 HCCL_E_NOT_FOUND,
7 HCCL_E_UNAVAIL, 8 HCCL_E_SYSCALL, 9 HCCL_E_TIMEOUT, 10 HCCL_E_OPEN_FILE_FAILURE, 11 HCCL_E_TCP_CONNECT,
12 HCCL_E_ROCE_CONNECT, 13 HCCL_E_TCP_TRANSFER, 14 HCCL_E_ROCE_TRANSFER, 15 HCCL_E_RUNTIME, 16 HCCL_E_DRV,
17 HCCL_E_PROFILING, 18 HCCL_E_CCE, 19 HCCL_E_NETWORK, 20 HCCL_E_AGAIN, 21 HCCL_E_REMOTE, 22 HCCL_E_SUSPENDING.
(So 4 is HCCL_E_INTERNAL, not a timeout: the timeout is 9.)

torch_npu reports them as `HCCL function error: hcclCommInitRootInfoConfig(...), error code is N` (communicator
creation, which torch_npu does lazily at the first collective), `HcclGetRootInfo(&hcclID), error code is N`, or
`OPS function error: HcclAllreduce, error code is N`; HCCL's own log writes `errNo[0x000000000500000N]` (the low
16 bits are the code: `errNo[0x0000000005000007]` next to `hcclRet -> 7` in vllm-ascend #4725, `errNo[...05000002]`
next to `error:2` in gpustack #2021). Messages also carry CANN error ids such as EI0006 or EJ0003.

The usual causes below come from the threads named with each row (issues of verl, vllm-ascend, lmdeploy, gpustack);
they are what to look at first, not a diagnosis: the HCCL plog (~/ascend/log, ASCEND_GLOBAL_EVENT_ENABLE=1) says more.
How firm each is: 7, 9, 11 and 15 come with the log lines that show the cause (bind failed, LinkEstablish timeout,
listen failed, device id error); 4 and 5 are the codes of two open verl threads of multi-node runs (#3947, #5074)
whose traces do not name the cause, tied to the HCCL NIC and ports by the project's notes, so both point there first;
1 is a parameter error by HCCL's own definition. Nothing here was reproduced on an NPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAMES = {0: "HCCL_SUCCESS", 1: "HCCL_E_PARA", 2: "HCCL_E_PTR", 3: "HCCL_E_MEMORY", 4: "HCCL_E_INTERNAL",
         5: "HCCL_E_NOT_SUPPORT", 6: "HCCL_E_NOT_FOUND", 7: "HCCL_E_UNAVAIL", 8: "HCCL_E_SYSCALL", 9: "HCCL_E_TIMEOUT",
         10: "HCCL_E_OPEN_FILE_FAILURE", 11: "HCCL_E_TCP_CONNECT", 12: "HCCL_E_ROCE_CONNECT",
         13: "HCCL_E_TCP_TRANSFER", 14: "HCCL_E_ROCE_TRANSFER", 15: "HCCL_E_RUNTIME", 16: "HCCL_E_DRV",
         17: "HCCL_E_PROFILING", 18: "HCCL_E_CCE", 19: "HCCL_E_NETWORK", 20: "HCCL_E_AGAIN", 21: "HCCL_E_REMOTE",
         22: "HCCL_E_SUSPENDING"}

NIC = ("the NIC: HCCL_IF_IP must be this node's address on the cluster network and HCCL_SOCKET_IFNAME that "
       "interface, on every node (`ip -4 addr`); check the NPU links with `hccn_tool -i N -link -g`, "
       "`-net_health -g` and a cross-node `hccn_tool -i N -ping -g address PEER_NPU_IP`")
PORTS = ("the port range: another process holds HCCL's ports (default from 60000) or a firewall blocks them "
         "between the nodes; set HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE to a free range open "
         "between the nodes, and stop stale training processes (`npu-smi info` lists them)")
TIMEOUT = ("the timeout: the other rank did not connect in time (not started, stuck, or unreachable); start both "
           "nodes within HCCL_CONNECT_TIMEOUT seconds of each other (raise it for slow starts), then look at the NIC "
           "and the port range")


@dataclass(frozen=True)
class Cause:
    code: int
    usual: str  # what it usually means here, and what to do
    sources: str  # the threads it was seen in


CAUSES = {
    1: Cause(1, "parameters the ranks disagree on (world size, rank, device id): every node must run with the same "
                "world size and its own rank", "vllm-ascend #2712, #11542"),
    4: Cause(4, "the HCCL network settings of a multi-node run: check " + NIC + "; then " + PORTS,
             "verl #3947 (multi-node, hcclCommInitRootInfoConfig code 4)"),
    5: Cause(5, "the HCCL network settings of a multi-node run (at communicator creation): check " + NIC + "; then "
                + PORTS, "verl #5074 (Atlas A2, hcclCommInitRootInfoConfig code 5)"),
    6: Cause(6, "a collective found no peer data (EI0006: the remote rank did not send in time): the other rank "
                "failed or is stuck; read its log first, then " + TIMEOUT,
             "vllm-ascend #486 (HcclAllreduce code 6 with EI0006)"),
    7: Cause(7, "a resource is taken, usually the listen port (EJ0003 / EI0019 bind failed): " + PORTS,
             "lmdeploy PR #4722 (HcclGetRootInfo code 7, EJ0003), vllm-ascend #4725 (listen fail, hcclRet 7)"),
    9: Cause(9, "socket establishment timed out: " + TIMEOUT, "vllm-ascend #9447 (LinkEstablish timeout, ret[9])"),
    11: Cause(11, "the host NIC's TCP listen/connect failed: " + PORTS + "; and " + NIC,
              "vllm-ascend #405 (HcclGetRootInfo code 11, port bound), #3196 (hcclCommInitRootInfoConfig code 11)"),
    12: Cause(12, "the RoCE link between the NPUs failed: " + NIC, "HcclResult: roce connect fail"),
    15: Cause(15, "a runtime call failed, e.g. a device id the process cannot see (ASCEND_RT_VISIBLE_DEVICES "
                  "renumbered by Ray: RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 before `ray start`), or a "
                  "CANN bug: compare CANN with the lock",
              "vllm-ascend #672 (code 15, device id error; fixed in a later CANN)"),
    21: Cause(21, "a remote error: the peer process exited or the network dropped: read the other node's log, "
                  "then " + NIC, "torch_npu's HCCLUtils message for HCCL_E_REMOTE"),
}

# CANN error ids that travel with these failures (from the same threads).
ERROR_IDS = {
    "EI0006": "getting a socket timed out: the remote rank did not send its data in time",
    "EJ0003": "binding the IP and port failed: they are already bound by another process",
    "EI0019": "binding the IP and port failed",
    "EI0009": "transport init error: creating the link to the destination rank failed",
}

_FUNC_CODE = re.compile(r"(?:HCCL|OPS) function error:\s*([A-Za-z]\w*)(?:\([^)]*\)*)?,\s*error code is\s*(\d+)")
_ERRNO = re.compile(r"errNo\[0x([0-9a-fA-F]+)\]")
_ERROR_ID = re.compile(r"\b(E[A-Z]\d{4})\b")


@dataclass(frozen=True)
class HcclError:
    code: int | None
    function: str | None
    error_ids: tuple[str, ...]

    @property
    def name(self) -> str:
        return NAMES.get(self.code, f"code {self.code}") if self.code is not None else "no HCCL code"


def parse_hccl_error(text: str) -> HcclError | None:
    """The first HCCL return code in a traceback or log (torch_npu's 'error code is N', else HCCL's errNo), the
    function that returned it, and the CANN error ids seen. None when the text holds none of these."""
    m = _FUNC_CODE.search(text)
    code, function = (int(m.group(2)), m.group(1)) if m else (None, None)
    if code is None:
        e = _ERRNO.search(text)
        if e:
            code = int(e.group(1), 16) & 0xFFFF
    ids = tuple(dict.fromkeys(_ERROR_ID.findall(text)))
    if code is None and not ids:
        return None
    return HcclError(code, function, ids)


def explain(err: HcclError) -> str:
    """One line: the code's name, where it came from, its usual cause here and what to do, and the source."""
    where = f" from {err.function}" if err.function else ""
    head = f"{err.name}{f' ({err.code})' if err.code is not None else ''}{where}"
    ids = "".join(f"; {i}: {ERROR_IDS[i]}" for i in err.error_ids if i in ERROR_IDS)
    cause = CAUSES.get(err.code) if err.code is not None else None
    if cause is None:
        return (f"{head}{ids}: no usual cause is known here; read the HCCL plog (~/ascend/log, "
                f"ASCEND_GLOBAL_EVENT_ENABLE=1) on both nodes")
    return f"{head}{ids}: usually {cause.usual} (seen in {cause.sources})"
