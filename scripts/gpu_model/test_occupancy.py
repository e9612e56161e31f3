"""python3 -m unittest discover -s scripts/gpu_model (or run this file).

The occupancy cases are worked by hand from the rules in occupancy.py, the
same answers as NVIDIA's occupancy calculator for compute capability 9.0.
The compile tests need the NVRTC wheel that scripts/test.sh installs and
skip without it.
"""

import io
import re
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import resources  # noqa: E402
from occupancy import SM90, occupancy  # noqa: E402

KB = 1024


class Occupancy(unittest.TestCase):
    def check(self, threads, regs, shared, blocks, warps, fraction):
        o = occupancy(threads, regs, shared)
        self.assertEqual((o.blocks, o.warps), (blocks, warps), o)
        self.assertAlmostEqual(o.fraction, fraction)
        return o

    def test_small_kernel_fills_the_sm(self):
        self.check(256, 32, 0, 8, 64, 1.0)

    def test_registers_limit(self):
        self.assertEqual(self.check(256, 128, 0, 2, 16, 0.25).limited_by, ("registers",))
        self.check(1024, 64, 0, 1, 32, 0.5)

    def test_registers_round_up_per_warp(self):
        # 33 x 32 = 1056 registers a warp, allocated as 1280: 12 warps per
        # sub-partition, 48 per SM, 6 blocks of 8 warps.
        self.check(256, 33, 0, 6, 48, 0.75)

    def test_static_shared_limit(self):
        # 48 KB + the reserved 1 KB = 50176 B a block; 228 KB holds 4.
        self.assertEqual(self.check(128, 32, 48 * KB, 4, 16, 0.25).limited_by, ("shared",))

    def test_reserved_shared_rounds_with_the_kernels_own(self):
        # 1 B + 1 KB rounds to 1152 B: 202 blocks' worth, so the 32-block cap binds.
        self.assertEqual(self.check(32, 16, 1, 32, 32, 0.5).limited_by, ("blocks",))
        # 113 KB + 1 KB fits once, 114 KB + 1 KB too (228 KB is not 2 x 115 KB).
        self.check(128, 32, 113 * KB, 2, 8, 0.125)
        self.check(128, 32, 114 * KB, 1, 4, 0.0625)

    def test_launches_that_cannot_run(self):
        self.assertEqual(occupancy(1025, 16, 0).blocks, 0)
        self.assertEqual(occupancy(64, 256, 0).blocks, 0)
        # 65 registers x 1024 threads is past the 64K a block may have.
        self.assertEqual(occupancy(1024, 65, 0).limited_by, ("registers",))
        self.assertEqual(occupancy(128, 32, 227 * KB).blocks, 1)
        self.assertEqual(occupancy(128, 32, 227 * KB + 1).limited_by, ("shared",))

    def test_partial_warp_counts_whole(self):
        self.check(33, 16, 0, 32, 64, 1.0)
        self.check(96 + 1, 16, 0, 16, 64, 1.0)

    def test_spec_default_is_sm90(self):
        self.assertEqual(SM90.name, "sm_90")
        self.assertEqual(occupancy(256, 32, 0, SM90), occupancy(256, 32, 0))


@unittest.skipUnless(resources.find_nvrtc(), f"NVRTC wheel absent: {resources.NVRTC_PIP}")
class Resources(unittest.TestCase):
    def compile(self, source, arch="sm_90"):
        lib = resources.find_nvrtc()
        options = resources.nvrtc_options(arch, resources.cuda_include_dir(lib))
        data = resources.Nvrtc(lib).cubin("probe.cu", source, {}, options)
        cuobjdump = resources.find_cuobjdump()
        if cuobjdump:
            resources.cross_check(cuobjdump, {"probe.cu": data})
        return resources.Cubin(data).kernels()

    def test_every_kernel_file_gives_kernels_with_registers(self):
        result = resources.collect("sm_90", log=io.StringIO())
        self.assertEqual(result["arch"], "sm_90")
        files = {p.name for p in resources.KERNELS.glob("*.cu")}
        self.assertEqual({k["file"] for k in result["kernels"].values()}, files)
        self.assertTrue(any(k["registers"] > 0 for k in result["kernels"].values()))
        # Second run: from the cache, the same object.
        self.assertEqual(resources.collect("sm_90", log=io.StringIO()), result)

    def test_the_elf_reading_of_a_known_kernel(self):
        k = self.compile(
            'extern "C" __global__ void __launch_bounds__(256) k(float* x) {\n'
            "  __shared__ float s[32];\n"
            "  s[threadIdx.x & 31] = x[threadIdx.x];\n"
            "  __syncthreads();\n"
            "  x[threadIdx.x] = s[31 - (threadIdx.x & 31)];\n"
            "}\n"
            "template <typename T> __global__ void t(T* p) { p[0] = 1; }\n"
            "template __global__ void t<float>(float*);\n"
        )
        self.assertEqual(set(k), {"k", "_Z1tIfEvPT_"})
        self.assertGreater(k["k"]["registers"], 0)
        self.assertEqual((k["k"]["shared_static"], k["k"]["local"], k["k"]["max_threads"]), (128, 0, 256))
        self.assertIsNone(k["_Z1tIfEvPT_"]["max_threads"])
        # sm_80 lays shared memory out without the reserved KB in front.
        self.assertEqual(self.compile('extern "C" __global__ void k(float* x) { __shared__ float s[8]; '
                                      "s[threadIdx.x & 7] = 1; __syncthreads(); x[0] = s[7 - (threadIdx.x & 7)]; }",
                                      "sm_80")["k"]["shared_static"], 32)

    def test_a_local_array_indexed_at_run_time_is_local_memory(self):
        k = self.compile(
            'extern "C" __global__ void k(const float* x, float* y, int i) {\n'
            "  float t[64];\n"
            "  for (int j = 0; j < 64; j++) t[j] = x[j * 977 + threadIdx.x];\n"
            "  for (int j = 0; j < 64; j++) t[(j * 5 + i) & 63] += t[j];\n"
            "  y[threadIdx.x] = t[i & 63];\n"
            "}\n"
        )
        self.assertGreaterEqual(k["k"]["local"], 256)

    def test_options_match_the_runtimes(self):
        rust = (resources.ROOT / "src/cuda/nvrtc.rs").read_text()
        block = rust[rust.index("let mut opts = vec!["): rust.index("let includes = cuda_include_dirs();")]
        self.assertEqual(re.findall(r'"(-[^"]*)"', block), resources.nvrtc_options("{arch}", None),
                         "src/cuda/nvrtc.rs compiles with other options than resources.py")
        self.assertIn('format!("--include-path={}"', rust)

if __name__ == "__main__":
    unittest.main()
