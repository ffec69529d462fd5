/* tests/support/cuemu.cpp: the runtime of the CUDA-on-CPU emulation (contract: cuemu.h). */
#include "cuemu.h"

#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

dim3 blockDim, gridDim;

namespace cuemu {

namespace {

/* Limits of sm_80 and later that a launch must respect. */
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kDefaultDynSmem = 48 * 1024;
constexpr size_t kMaxDynSmem = 227 * 1024;

/* A reusable barrier of n threads that also checks every thread of a generation waits with the
 * same kind, and gives up after CUEMU_TIMEOUT_S (a deadlock of the emulated kernel). */
struct barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0, count = 0, kind = 0;
    unsigned long gen = 0;

    void init(int threads)
    {
        n = threads;
        count = 0;
        gen = 0;
    }
    void wait(int k, const char *what)
    {
        std::unique_lock<std::mutex> lk(mu);
        if (count == 0) kind = k;
        else if (kind != k) {
            fprintf(stderr, "cuemu: divergent barrier: block (%u, %u, %u) thread %u reached %s "
                    "while others wait at another\n", blockIdx.x, blockIdx.y, blockIdx.z,
                    threadIdx.x, what);
            abort();
        }
        const unsigned long g = gen;
        if (++count == n) {
            count = 0;
            gen++;
            cv.notify_all();
            return;
        }
        if (!cv.wait_for(lk, std::chrono::seconds(CUEMU_TIMEOUT_S), [&] { return gen != g; })) {
            fprintf(stderr, "cuemu: deadlock: block (%u, %u, %u) thread %u waited %d s at %s "
                    "(%d of %d threads arrived)\n", blockIdx.x, blockIdx.y, blockIdx.z,
                    threadIdx.x, CUEMU_TIMEOUT_S, what, count, n);
            abort();
        }
    }
};

struct state {
    barrier block_bar;
    barrier warp_bar[kMaxThreads / 32];
    uint64_t slots[kMaxThreads / 32][2][32];
    std::vector<unsigned char> smem;
    std::map<const void *, int> max_dyn;
    cudaError_t last = cudaSuccess;
};

state &st()
{
    static state s;
    return s;
}

thread_local int t_phase;

} /* namespace */

void block_barrier(int kind)
{
    st().block_bar.wait(kind, kind ? "the end of the block" : "__syncthreads");
}

void warp_barrier()
{
    st().warp_bar[threadIdx.x >> 5].wait(0, "a warp shuffle");
}

uint64_t *warp_slot(int warp, int phase) { return st().slots[warp][phase]; }
int &warp_phase() { return t_phase; }
void *dyn_smem() { return st().smem.data(); }

cudaError_t last_error_take()
{
    cudaError_t e = st().last;
    st().last = cudaSuccess;
    return e;
}

void set_max_dyn_smem(const void *fn, int bytes) { st().max_dyn[fn] = bytes; }

cudaError_t run(const void *fn, dim3 grid, dim3 block, size_t smem, std::function<void()> body)
{
    state &s = st();
    const unsigned nt = block.x * block.y * block.z;
    size_t allowed = kDefaultDynSmem;
    auto it = s.max_dyn.find(fn);
    if (it != s.max_dyn.end() && (size_t)it->second > allowed) allowed = (size_t)it->second;
    if (block.y != 1 || block.z != 1 || nt == 0 || nt > kMaxThreads || nt % 32 ||
        grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
        smem > allowed || smem > kMaxDynSmem) {
        /* only 1-D blocks of whole warps are emulated (all that engine/cuda launches) */
        fprintf(stderr, "cuemu: launch refused: grid (%u, %u, %u), block (%u, %u, %u), %zu "
                "bytes of dynamic shared memory (allowed %zu)\n", grid.x, grid.y, grid.z, block.x,
                block.y, block.z, smem, allowed);
        s.last = cudaErrorInvalidConfiguration;
        return s.last;
    }
    gridDim = grid;
    blockDim = block;
    s.block_bar.init((int)nt);
    for (unsigned w = 0; w < nt / 32; w++) s.warp_bar[w].init(32);
    s.smem.assign(smem + 16, 0);
    const float poison = NAN;
    std::vector<std::thread> team;
    team.reserve(nt);
    for (unsigned t = 0; t < nt; t++)
        team.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            t_phase = 0;
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        if (t == 0) /* the others wait at the previous block's end barrier */
                            for (size_t i = 0; i + 4 <= s.smem.size(); i += 4)
                                memcpy(&s.smem[i], &poison, 4);
                        blockIdx = {x, y, z};
                        block_barrier(1); /* poison written before anyone reads */
                        body();
                        block_barrier(1);
                    }
        });
    for (auto &th : team) th.join();
    return cudaSuccess;
}

} /* namespace cuemu */
