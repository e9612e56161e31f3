// The emulated NCCL's collectives across processes: every rank is a forked
// child with its own CUDA context. Results must equal a CPU reference computed
// in the documented order (rank 0's contribution, then ranks 1, 2, .. folded
// in), bit for bit, f16 included.
#include "nccl_ranks.h"

using namespace nt;

namespace {

float xf(int r, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7919 + r * 104729) % 2001) - 1000) * 0.0137f + r * 1e-3f;
}
uint16_t xh(int r, size_t i) { return f2h(xf(r, i) * 0.37f); }

template <typename T> std::vector<T> inputs(int r, size_t n, T (*f)(int, size_t)) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; i++) v[i] = f(r, i);
  return v;
}

template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T> size_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(T))) return i;
  return a.size();
}

const int N = 3;

}  // namespace

TEST_CASE(nccl_allreduce_f32_sum_avg_premulsum_match_the_rank_order_reference) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    int v = 0, cnt = 0, me = -1, dev = -1;
    CHECK(ncclGetVersion(&v) == Success && v >= 22000);
    CHECK(ncclCommCount(c, &cnt) == Success && cnt == N);
    CHECK(ncclCommUserRank(c, &me) == Success && me == rank);
    CHECK(ncclCommCuDevice(c, &dev) == Success && dev == 0);
    const size_t n = 1001;
    std::vector<std::vector<float>> x;
    for (int r = 0; r < N; r++) x.push_back(inputs<float>(r, n, xf));
    auto hs = [](int r) { return 0.25f * (r + 1) + 0.1f; };  // host-immediate scalar of rank r
    auto ds = [](int r) { return 1.5f - 0.3f * r; };         // device-resident scalar of rank r
    std::vector<float> sum(n), avg(n), pms(n), pmd(n);
    float inv = static_cast<float>(1.0 / N);
    for (size_t i = 0; i < n; i++) {
      sum[i] = x[0][i], avg[i] = x[0][i] * inv, pms[i] = x[0][i] * hs(0), pmd[i] = x[0][i] * ds(0);
      for (int r = 1; r < N; r++) {
        sum[i] += x[r][i];
        avg[i] += x[r][i] * inv;
        pms[i] += x[r][i] * hs(r);
        pmd[i] += x[r][i] * ds(r);
      }
    }
    CUdeviceptr in = d.upload(x[rank]), out = d.upload(std::vector<float>(n, -1));
    CUdeviceptr a = d.upload(x[rank]), b = d.upload(x[rank]), e = d.upload(x[rank]);
    CUdeviceptr scal = d.upload(std::vector<float>{ds(rank)});
    float h = hs(rank);
    int op_h = -1, op_d = -1;
    CHECK(ncclRedOpCreatePreMulSum(&op_h, &h, Float32, ScalarHost, c) == Success);
    h = 99;  // host-immediate: read at creation
    CHECK(ncclRedOpCreatePreMulSum(&op_d, reinterpret_cast<void*>(scal), Float32, ScalarDevice, c) == Success);
    CHECK_MSG(op_h >= 5 && op_d >= 5 && op_h != op_d, "ops %d %d", op_h, op_d);
    CHECK(ncclAllReduce((void*)in, (void*)out, n, Float32, Sum, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)a, (void*)a, n, Float32, Avg, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)b, (void*)b, n, Float32, op_h, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)e, (void*)e, n, Float32, op_d, c, d.s) == Success);
    auto got = d.download<float>(out, n);
    CHECK_MSG(same_bits(got, sum), "sum differs at %zu", first_diff(got, sum));
    got = d.download<float>(a, n);
    CHECK_MSG(same_bits(got, avg), "avg differs at %zu", first_diff(got, avg));
    got = d.download<float>(b, n);
    CHECK_MSG(same_bits(got, pms), "host PreMulSum differs at %zu: %g vs %g", first_diff(got, pms),
              got[first_diff(got, pms) % n], pms[first_diff(got, pms) % n]);
    got = d.download<float>(e, n);
    CHECK_MSG(same_bits(got, pmd), "device PreMulSum differs at %zu", first_diff(got, pmd));
    CHECK(same_bits(d.download<float>(in, n), x[rank]));  // out of place leaves send alone
    CHECK(ncclRedOpDestroy(op_h, c) == Success && ncclRedOpDestroy(op_d, c) == Success);
    CHECK(ncclRedOpDestroy(op_d, c) == InvalidArgument);
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == Success);
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_allreduce_f16_rounds_every_step_to_f16_bit_exact) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    const size_t n = 4099;
    std::vector<std::vector<uint16_t>> x;
    for (int r = 0; r < N; r++) x.push_back(inputs<uint16_t>(r, n, xh));
    // Values that overflow f16 when summed, and ones that sit on rounding ties.
    for (int r = 0; r < N; r++) x[r][0] = f2h(30000.f + r), x[r][1] = f2h(2048.f), x[r][2] = f2h(1.0f + r / 1024.f);
    uint16_t hs[N] = {f2h(0.3f), f2h(1.7f), f2h(-0.55f)};
    uint16_t inv = f2h(static_cast<float>(1.0 / N));
    std::vector<uint16_t> sum(n), avg(n), pms(n);
    for (size_t i = 0; i < n; i++) {
      float s = h2f(x[0][i]), a = h2f(f2h(h2f(x[0][i]) * h2f(inv))), p = h2f(f2h(h2f(x[0][i]) * h2f(hs[0])));
      for (int r = 1; r < N; r++) {
        s = h2f(f2h(s + h2f(x[r][i])));
        a = h2f(f2h(a + h2f(f2h(h2f(x[r][i]) * h2f(inv)))));
        p = h2f(f2h(p + h2f(f2h(h2f(x[r][i]) * h2f(hs[r])))));
      }
      sum[i] = f2h(s), avg[i] = f2h(a), pms[i] = f2h(p);
    }
    CHECK(sum[0] == 0x7c00);  // 90003 overflows to +inf
    CUdeviceptr s = d.upload(x[rank]), a = d.upload(x[rank]), p = d.upload(x[rank]);
    uint16_t h = hs[rank];
    int op = -1;
    CHECK(ncclRedOpCreatePreMulSum(&op, &h, Float16, ScalarHost, c) == Success);
    CHECK(ncclAllReduce((void*)s, (void*)s, n, Float16, Sum, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)a, (void*)a, n, Float16, Avg, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)p, (void*)p, n, Float16, op, c, d.s) == Success);
    auto got = d.download<uint16_t>(s, n);
    CHECK_MSG(same_bits(got, sum), "f16 sum differs at %zu", first_diff(got, sum));
    got = d.download<uint16_t>(a, n);
    CHECK_MSG(same_bits(got, avg), "f16 avg differs at %zu", first_diff(got, avg));
    got = d.download<uint16_t>(p, n);
    CHECK_MSG(same_bits(got, pms), "f16 PreMulSum differs at %zu", first_diff(got, pms));
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_broadcast_from_a_nonzero_root_in_and_out_of_place) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    const size_t n = 333;
    auto mine = inputs<float>(rank, n, xf), root = inputs<float>(2, n, xf);
    CUdeviceptr in = d.upload(mine), out = d.upload(std::vector<float>(n, -7)), inplace = d.upload(mine);
    CHECK(ncclBroadcast((void*)in, (void*)out, n, Float32, 2, c, d.s) == Success);
    CHECK(ncclBroadcast((void*)inplace, (void*)inplace, n, Float32, 1, c, d.s) == Success);
    CHECK(same_bits(d.download<float>(out, n), root));
    CHECK(same_bits(d.download<float>(inplace, n), inputs<float>(1, n, xf)));
    CHECK(ncclBroadcast((void*)in, (void*)out, n, Float32, 3, c, d.s) == InvalidArgument);
    CHECK(std::strstr(ncclGetLastError(c), "root 3") != nullptr);
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_allgather_reduce_and_reduce_scatter_place_each_rank_s_part) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    const size_t n = 5;
    auto mine = inputs<float>(rank, n, xf);
    CUdeviceptr in = d.upload(mine), out = d.upload(std::vector<float>(n * N, -1));
    CHECK(ncclAllGather((void*)in, (void*)out, n, Float32, c, d.s) == Success);
    std::vector<float> all;
    for (int r = 0; r < N; r++) {
      auto v = inputs<float>(r, n, xf);
      all.insert(all.end(), v.begin(), v.end());
    }
    CHECK(same_bits(d.download<float>(out, n * N), all));
    // In place: rank r's part already sits at recv + r*n.
    CUdeviceptr ip = d.upload(std::vector<float>(n * N, -1));
    CHECK(cuMemcpyHtoD_v2(ip + rank * n * sizeof(float), mine.data(), n * sizeof(float)) == 0);
    CHECK(ncclAllGather((void*)(ip + rank * n * sizeof(float)), (void*)ip, n, Float32, c, d.s) == Success);
    CHECK(same_bits(d.download<float>(ip, n * N), all));
    // int32 max to root 1, and a reduce-scatter sum.
    std::vector<int32_t> iv(7);
    for (size_t i = 0; i < iv.size(); i++) iv[i] = static_cast<int32_t>((i * 31 + rank * 17) % 23) - 11;
    CUdeviceptr ii = d.upload(iv), io = d.upload(std::vector<int32_t>(7, 1234));
    CHECK(ncclReduce((void*)ii, (void*)io, 7, Int32, Max, 1, c, d.s) == Success);
    auto got = d.download<int32_t>(io, 7);
    for (size_t i = 0; i < 7; i++) {
      int32_t m = INT32_MIN;
      for (int r = 0; r < N; r++) m = std::max(m, static_cast<int32_t>((i * 31 + r * 17) % 23) - 11);
      CHECK_MSG(got[i] == (rank == 1 ? m : 1234), "reduce max [%zu] = %d", i, got[i]);
    }
    CUdeviceptr rs = d.upload(all), ro = d.upload(std::vector<float>(n, 0));
    CHECK(ncclReduceScatter((void*)rs, (void*)ro, n, Float32, Sum, c, d.s) == Success);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; i++) want[i] = all[rank * n + i] + all[rank * n + i] + all[rank * n + i];
    CHECK(same_bits(d.download<float>(ro, n), want));
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_group_of_two_buffers_runs_both_at_group_end) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    auto x = inputs<float>(rank, 100, xf);
    auto y = inputs<uint16_t>(rank, 50, xh);
    CUdeviceptr a = d.upload(x), b = d.upload(y);
    CHECK(ncclGroupStart() == Success);
    CHECK(ncclGroupStart() == Success);  // nested: only the outermost end launches
    CHECK(ncclAllReduce((void*)a, (void*)a, 100, Float32, Sum, c, d.s) == Success);
    CHECK(ncclGroupEnd() == Success);
    CHECK(ncclAllReduce((void*)b, (void*)b, 50, Float16, Max, c, d.s) == Success);
    CHECK(cuStreamSynchronize(d.s) == 0);
    CHECK(same_bits(d.download<float>(a, 100), x));  // nothing ran before the group ended
    CHECK(ncclGroupEnd() == Success);
    std::vector<float> sx(100);
    std::vector<uint16_t> my(50);
    for (size_t i = 0; i < 100; i++) sx[i] = xf(0, i) + xf(1, i) + xf(2, i);
    for (size_t i = 0; i < 50; i++)
      my[i] = f2h(std::max(std::max(h2f(xh(0, i)), h2f(xh(1, i))), h2f(xh(2, i))));
    CHECK(same_bits(d.download<float>(a, 100), sx));
    CHECK(same_bits(d.download<uint16_t>(b, 50), my));
    // A failed call fails the whole group: nothing is enqueued.
    CHECK(ncclGroupStart() == Success);
    CHECK(ncclAllReduce((void*)a, (void*)a, 100, Float32, Sum, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)a, (void*)a, 100, 77, Sum, c, d.s) == InvalidArgument);
    CHECK(ncclGroupEnd() == InvalidArgument);
    CHECK(ncclGroupEnd() == InvalidUsage);  // no group open
    CHECK(same_bits(d.download<float>(a, 100), sx));
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_world_of_one_copies) {
  run_ranks(1, [](int, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(0, 1, id);
    auto y = inputs<uint16_t>(0, 64, xh);
    CUdeviceptr b = d.upload(y), o = d.upload(std::vector<uint16_t>(64, 0));
    CHECK(ncclAllReduce((void*)b, (void*)o, 64, Float16, Avg, c, d.s) == Success);
    CHECK(ncclAllGather((void*)b, (void*)b, 64, Float16, c, d.s) == Success);
    CHECK(same_bits(d.download<uint16_t>(o, 64), y));
    CHECK(same_bits(d.download<uint16_t>(b, 64), y));
    CHECK(ncclCommAbort(c) == Success);
    CHECK(ncclAllReduce((void*)b, (void*)o, 64, Float16, Avg, c, d.s) == InvalidArgument);
  });
}

TEST_CASE(nccl_mismatched_count_or_op_is_invalid_usage_on_every_rank) {
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    CUdeviceptr a = d.upload(std::vector<float>(8, 1.0f));
    size_t count = rank == 1 ? 7 : 8;
    CHECK(ncclAllReduce((void*)a, (void*)a, count, Float32, Sum, c, d.s) == Success);  // asynchronous
    CHECK(cuStreamSynchronize(d.s) == 0);  // the stream moves on
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success);
    CHECK_MSG(ae == InvalidUsage, "async error %d", ae);
    const char* m = ncclGetLastError(c);
    CHECK_MSG(std::strstr(m, "count mismatch") && std::strstr(m, "rank 1 count 7"), "message: %s", m);
    auto got = d.download<float>(a, 8);
    CHECK(std::isnan(got[0]));  // the failed output is poisoned
    CHECK(ncclAllReduce((void*)a, (void*)a, 8, Float32, Sum, c, d.s) == InvalidUsage);  // refused from now on
    CHECK(ncclCommDestroy(c) == Success);
  });
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    CUdeviceptr a = d.upload(std::vector<float>(8, 1.0f));
    CHECK(ncclAllReduce((void*)a, (void*)a, 8, Float32, rank == 2 ? Max : Sum, c, d.s) == Success);
    CHECK(cuStreamSynchronize(d.s) == 0);
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == InvalidUsage);
    CHECK_MSG(std::strstr(ncclGetLastError(c), "op mismatch"), "message: %s", ncclGetLastError(c));
    CHECK(ncclCommDestroy(c) == Success);
  });
  run_ranks(N, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, N, id);
    CUdeviceptr a = d.upload(std::vector<float>(8, 1.0f));
    CHECK(ncclBroadcast((void*)a, (void*)a, 8, Float32, rank == 1 ? 0 : 2, c, d.s) == Success);
    CHECK(cuStreamSynchronize(d.s) == 0);
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == InvalidUsage);
    CHECK_MSG(std::strstr(ncclGetLastError(c), "root mismatch: rank 0 passed root 2, rank 1 root 0"),
              "message: %s", ncclGetLastError(c));
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_MAIN
