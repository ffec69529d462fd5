/* tests/support/cuemu.cpp: the runtime of the CUDA-on-CPU emulation (contract: cuemu.h). */
#include "cuemu.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUEMU_ASAN 1
#endif
#endif
#ifdef CUEMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

dim3 blockDim, gridDim;

namespace cuemu {

namespace {

/* Limits of sm_80 and later that a launch must respect. */
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kDefaultDynSmem = 48 * 1024;
constexpr size_t kMaxDynSmem = 227 * 1024;
/* Each CUDA thread's stack (a fiber's): mapped, touched only as far as used. */
constexpr size_t kStack = 256 * 1024;

/* One CUDA thread of the running launch: a fiber on the launching OS thread. */
struct fiber {
    ucontext_t ctx;
    bool done;
    int phase; /* its warp-exchange phase (warp_phase) */
};

/* A reusable barrier of n fibers that also checks every fiber of a generation waits with the
 * same kind. A fiber that is not the last to arrive yields to the scheduler until the
 * generation changes. */
struct barrier {
    int n = 0, count = 0, kind = 0;
    unsigned long gen = 0;

    void init(int threads)
    {
        n = threads;
        count = 0;
        gen = 0;
    }
    void wait(int k, const char *what);
};

struct state {
    barrier block_bar;
    barrier warp_bar[kMaxThreads / 32];
    uint64_t slots[kMaxThreads / 32][2][32];
    uint32_t mma_slots[kMaxThreads / 32][2][32][6];
    std::vector<unsigned char> smem;
    std::map<const void *, int> max_dyn;
    cudaError_t last = cudaSuccess;
    /* the running launch (run): its fibers and their stacks, the scheduler's context, the fiber
     * running now, and a count of barrier arrivals and fiber ends (the scheduler's progress) */
    fiber fib[kMaxThreads];
    char *stacks = nullptr;
    size_t stacks_len = 0;
    ucontext_t sched;
    unsigned cur = 0;
    unsigned long events = 0;
    dim3 grid;
    const std::function<void()> *body = nullptr;
#ifdef CUEMU_ASAN
    const void *main_bottom = nullptr;
    size_t main_size = 0;
#endif
};

state &st()
{
    static state s;
    return s;
}

/* Switches from the running fiber back to the scheduler (run). */
void yield_to_scheduler()
{
    state &s = st();
#ifdef CUEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, s.main_bottom, s.main_size);
#endif
    swapcontext(&s.fib[s.cur].ctx, &s.sched);
#ifdef CUEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void barrier::wait(int k, const char *what)
{
    if (count == 0) kind = k;
    else if (kind != k) {
        fprintf(stderr, "cuemu: divergent barrier: block (%u, %u, %u) thread %u reached %s "
                "while others wait at another\n", blockIdx.x, blockIdx.y, blockIdx.z,
                threadIdx.x, what);
        abort();
    }
    st().events++;
    const unsigned long g = gen;
    if (++count == n) {
        count = 0;
        gen++;
        return;
    }
    while (gen == g) yield_to_scheduler();
}

/* A fiber's body: every block of the grid in order, as a team with the other fibers. */
void fiber_main(int t)
{
    state &s = st();
#ifdef CUEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
    const float poison = NAN;
    for (unsigned z = 0; z < s.grid.z; z++)
        for (unsigned y = 0; y < s.grid.y; y++)
            for (unsigned x = 0; x < s.grid.x; x++) {
                if (t == 0) /* the others wait at the previous block's end barrier */
                    for (size_t i = 0; i + 4 <= s.smem.size(); i += 4)
                        memcpy(&s.smem[i], &poison, 4);
                blockIdx = {x, y, z};
                block_barrier(1); /* poison written before anyone reads */
                (*s.body)();
                block_barrier(1);
            }
    s.fib[t].done = true;
    s.events++;
#ifdef CUEMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, s.main_bottom, s.main_size);
#endif
    /* returning resumes uc_link: the scheduler */
}

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
uint32_t *warp_mma_slot(int warp, int phase, int lane) { return st().mma_slots[warp][phase][lane]; }
int &warp_phase() { return st().fib[threadIdx.x].phase; }
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
    s.grid = grid;
    s.body = &body;
    s.block_bar.init((int)nt);
    for (unsigned w = 0; w < nt / 32; w++) s.warp_bar[w].init(32);
    s.smem.assign(smem + 16, 0);
    if (!s.stacks) {
        s.stacks_len = kStack * kMaxThreads;
        void *m = mmap(nullptr, s.stacks_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cuemu: cannot map %zu bytes of fiber stacks\n", s.stacks_len);
            abort();
        }
        s.stacks = (char *)m;
    }
    for (unsigned t = 0; t < nt; t++) {
        fiber &f = s.fib[t];
        f.done = false;
        f.phase = 0;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = s.stacks + (size_t)t * kStack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = &s.sched;
        makecontext(&f.ctx, (void (*)())fiber_main, 1, (int)t);
    }
    /* Round robin until every fiber has ended: each pass resumes every live fiber once, in
     * alternating order (ascending, then descending), so a read of what another thread writes
     * without a barrier in between sees the other order too; a pass in which no fiber arrived at
     * a barrier or ended is a deadlock. */
    for (unsigned pass = 0;; pass++) {
        const unsigned long ev0 = s.events;
        unsigned alive = 0;
        for (unsigned i = 0; i < nt; i++) {
            const unsigned t = (pass & 1) ? nt - 1 - i : i;
            if (s.fib[t].done) continue;
            alive++;
            s.cur = t;
            threadIdx = {t, 0, 0};
#ifdef CUEMU_ASAN
            void *fake = nullptr;
            __sanitizer_start_switch_fiber(&fake, s.fib[t].ctx.uc_stack.ss_sp, kStack);
#endif
            swapcontext(&s.sched, &s.fib[t].ctx);
#ifdef CUEMU_ASAN
            __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
        }
        if (!alive) break;
        if (s.events == ev0) {
            unsigned t = 0;
            while (s.fib[t].done) t++;
            fprintf(stderr, "cuemu: deadlock: block (%u, %u, %u): %u of %u threads still wait "
                    "(thread %u among them; %d of %d arrived at the block barrier)\n", blockIdx.x,
                    blockIdx.y, blockIdx.z, alive, nt, t, s.block_bar.count, s.block_bar.n);
            abort();
        }
    }
    s.body = nullptr;
    return cudaSuccess;
}

} /* namespace cuemu */
