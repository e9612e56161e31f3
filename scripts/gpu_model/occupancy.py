"""Resident blocks and warps of one kernel launch on one SM.

The rules are those of NVIDIA's occupancy calculator, cuda_occupancy.h (the
code behind cudaOccupancyMaxActiveBlocksPerMultiprocessor; the
nvidia-cuda-runtime wheel ships it in nvidia/cu13/include/), with the numbers
of compute capability 9.0 (H100, H200) from the CUDA C++ Programming Guide's
"Technical Specifications per Compute Capability" table. Each rule below
names the cuda_occupancy.h function it follows.
"""

from dataclasses import dataclass
from typing import NamedTuple

KB = 1024
# cuda_occupancy.h's INT_MAX for a resource the kernel does not use.
UNLIMITED = 2**31 - 1


@dataclass(frozen=True)
class Spec:
    name: str
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    # Registers are handed to a warp in units of this many (per warp, not
    # per thread).
    reg_alloc_unit: int
    max_regs_per_thread: int
    # The register file is split among this many schedulers; a warp's
    # registers all come from its scheduler's quarter.
    sub_partitions: int
    shared_per_sm: int
    # Without the reserved KB below; a block may only use more than 48 KB
    # (all of it dynamic) after cudaFuncSetAttribute's opt-in.
    shared_per_block: int
    # What the driver keeps for itself in every block, on top of the
    # kernel's own shared memory (since Ampere).
    shared_reserved_per_block: int
    shared_alloc_unit: int


SM90 = Spec(
    name="sm_90",
    warp_size=32,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    regs_per_sm=64 * KB,
    regs_per_block=64 * KB,
    reg_alloc_unit=256,
    # cuda_occupancy.h's cudaOccRegAllocationMaxPerThread says 256, but
    # ptxas never gives a thread more than 255 (the Programming Guide's
    # limit), so 256 only ever meets hand-made inputs.
    max_regs_per_thread=255,
    sub_partitions=4,
    shared_per_sm=228 * KB,
    shared_per_block=227 * KB,
    shared_reserved_per_block=1 * KB,
    shared_alloc_unit=128,
)


class Occupancy(NamedTuple):
    blocks: int  # resident blocks per SM
    warps: int  # active warps per SM
    fraction: float  # warps over the SM's maximum
    # Every limit that equals `blocks` ("warps", "blocks", "registers",
    # "shared"), as cuda_occupancy.h's limitingFactors flags; with 0 blocks,
    # the reasons the launch cannot run.
    limited_by: tuple


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(block_threads: int, registers: int, shared_bytes: int, spec: Spec = SM90) -> Occupancy:
    """Blocks of `block_threads` threads, each thread using `registers`
    registers and each block `shared_bytes` of shared memory (static plus
    dynamic, without the driver's reserved KB, i.e. what
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES and resources.py report).

    The barrier limit of Hopper (cudaOccMaxBlocksPerSMBlockBarrierLimit:
    2 barriers per block slot) is left out: it only binds for kernels that
    use more than 2 named barriers, and __syncthreads uses one.
    """
    if block_threads <= 0 or registers < 0 or shared_bytes < 0:
        raise ValueError(f"bad launch: {block_threads} threads, {registers} registers, {shared_bytes} B shared")
    max_warps = spec.max_threads_per_sm // spec.warp_size
    warps_per_block = -(-block_threads // spec.warp_size)

    # cudaOccMaxBlocksPerSMWarpsLimit: whole warps, even for a partial one.
    by_warps = 0 if block_threads > spec.max_threads_per_block else max_warps // warps_per_block

    # cudaOccMaxBlocksPerMultiprocessor.
    by_blocks = spec.max_blocks_per_sm

    # cudaOccMaxBlocksPerSMRegsLimit: a warp's registers are rounded up to
    # the allocation unit, and warps are placed per sub-partition, so a
    # sub-partition's leftover registers serve no warp of another one.
    regs_per_warp = _round_up(registers * spec.warp_size, spec.reg_alloc_unit)
    # The hardware's launch check assumes a block's warps spread over all
    # sub-partitions at once, so it counts warps rounded up to their number.
    regs_checked = regs_per_warp * _round_up(warps_per_block, spec.sub_partitions)
    if (
        registers > spec.max_regs_per_thread
        or regs_checked > spec.regs_per_block
        or regs_per_warp * warps_per_block > spec.regs_per_block
    ):
        by_regs = 0
    elif regs_per_warp == 0:
        by_regs = UNLIMITED
    else:
        warps_per_sub = (spec.regs_per_sm // spec.sub_partitions) // regs_per_warp
        by_regs = warps_per_sub * spec.sub_partitions // warps_per_block

    # cudaOccMaxBlocksPerSMSmemLimit with the default carveout (all of the
    # SM's shared memory on offer): the reserved KB counts against every
    # block before rounding to the allocation unit, and against the
    # per-block limit too (cudaOccSMemPerBlock adds it there).
    shared_per_block = _round_up(shared_bytes + spec.shared_reserved_per_block, spec.shared_alloc_unit)
    if shared_per_block > spec.shared_per_block + spec.shared_reserved_per_block:
        by_shared = 0
    else:
        by_shared = spec.shared_per_sm // shared_per_block

    limits = {"warps": by_warps, "blocks": by_blocks, "registers": by_regs, "shared": by_shared}
    blocks = min(limits.values())
    warps = blocks * warps_per_block
    limited_by = tuple(k for k, v in limits.items() if v == blocks)
    return Occupancy(blocks, warps, warps / max_warps, limited_by)
