// GA-2 Verilator driver: runs a batch of programs, each on a fresh model of the chip harness.
//
// Usage: ga2sim JOBS.bin RESULTS.bin. Both files are native-endian uint32 words (see sim/backends/verilator_backend.py):
//   jobs:    magic, EXT, max_cycles, njobs, then per job: NI, NI x 4 instruction words (most significant
//            word first), EXT words of external memory, NS (0, or GA2_SPAD for an initial scratchpad),
//            NS scratchpad words.
//   results: magic, njobs, then per job: halted, edges clocked after start, the five counters,
//            run time in ns (two words, low first), error, error_kind, error_pc, error_info (GA2_ERRORS
//            models: a chip other than the book's; zeros otherwise), the sequencer's pc, opcode in flight
//            and state at the end (what a job that did not halt is told), EXT words of final external
//            memory, then the GA2_SPAD words of the final scratchpad.
// Per job (hardware spec 6.2): one reset edge, one idle edge, the ROM, the non-zero external words and
// (GA2_GATHER models only: resident mode, docs/resident.md) the non-zero initial scratchpad words through
// the backdoor ports (a fresh model starts with every memory at zero, as the book's testbench zeroes the
// scratchpad), a one-edge start pulse, then edges until `halted` or max_cycles.
// A model built with GA2_ASSERT (Verilator --assert: the design's immediate assertions are evaluated) does
// not abort on a failed assertion: the job ends at that edge, and a line
// "ga2sim: assertion failed: job J, edge N" (N = edges after the start pulse, 0 for the start edge, -1 for
// the load) follows the model's own messages on stdout; the next job runs on a fresh model as usual.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "verilated.h"
#include "Vga2.h"

#ifndef GA2_EXT
#error "GA2_EXT (external memory words of the elaborated harness) must be defined"
#endif
#ifndef GA2_SPAD
#error "GA2_SPAD (scratchpad words of the chip) must be defined"
#endif

static const uint32_t MAGIC_JOBS = 0x4a324147u;     // "GA2J"
static const uint32_t MAGIC_JOBS_TRACED = 0x54324147u;  // "GA2T"
static const uint32_t MAGIC_RESULTS = 0x52324147u;  // "GA2R"

// Inputs change while the clock is low; one call is one rising edge (and the following fall).
static inline void edge(Vga2* m) {
    m->clk = 1;
    m->eval();
    m->clk = 0;
    m->eval();
}

// True when an assertion failed since the last call (only a GA2_ASSERT model evaluates them): says so on
// stdout, after the model's messages, and clears the context's error state for the next job.
static bool asserted(VerilatedContext* ctx, uint32_t job, int64_t edge_no) {
#ifdef GA2_ASSERT
    if (!ctx->gotError()) return false;
    std::fflush(stdout);
    std::printf("\nga2sim: assertion failed: job %u, edge %lld\n", job, (long long)edge_no);
    std::fflush(stdout);
    ctx->gotError(false);
    ctx->gotFinish(false);
    return true;
#else
    (void)ctx, (void)job, (void)edge_no;
    return false;
#endif
}

static int fail(const char* what, const char* path) {
    std::fprintf(stderr, "ga2sim: %s: %s\n", what, path);
    return 2;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s JOBS.bin RESULTS.bin\n", argv[0]);
        return 2;
    }
    std::FILE* in = std::fopen(argv[1], "rb");
    if (!in) return fail("cannot open the job file", argv[1]);
    std::vector<uint32_t> words;
    {
        uint32_t buf[4096];
        size_t n;
        while ((n = std::fread(buf, 4, 4096, in)) > 0) words.insert(words.end(), buf, buf + n);
        std::fclose(in);
    }
    if (words.size() < 4 || (words[0] != MAGIC_JOBS && words[0] != MAGIC_JOBS_TRACED))
        return fail("not a GA-2 job file", argv[1]);
    const bool traced = words[0] == MAGIC_JOBS_TRACED;
    const uint32_t ext = words[1];
    const uint64_t max_cycles = words[2];
    const uint32_t njobs = words[3];
    if (ext != GA2_EXT) {
        std::fprintf(stderr, "ga2sim: job file has EXT=%u but this model was built for EXT=%u\n", ext,
                     (unsigned)GA2_EXT);
        return 2;
    }

    std::vector<uint32_t> out;
    out.reserve(2 + (size_t)njobs * (13 + ext + GA2_SPAD));
    out.push_back(MAGIC_RESULTS);
    out.push_back(njobs);

    auto ctx = std::make_unique<VerilatedContext>();
#ifdef GA2_ASSERT
    ctx->fatalOnError(false);    // a failed assertion sets gotError instead of exiting the process
#endif
    size_t pos = 4;
    for (uint32_t j = 0; j < njobs; ++j) {
        if (pos >= words.size()) return fail("job file truncated", argv[1]);
        const uint32_t ni = words[pos++];
        if (ni > 256 || pos + 4ull * ni + ext > words.size()) return fail("bad job record", argv[1]);
        const uint32_t* prog = &words[pos];
        pos += 4ull * ni;
        const uint32_t* image = &words[pos];
        pos += ext;
        if (pos >= words.size()) return fail("job file truncated", argv[1]);
        const uint32_t ns_words = words[pos++];
        if ((ns_words != 0 && ns_words != GA2_SPAD) || pos + ns_words > words.size())
            return fail("bad scratchpad record", argv[1]);
        const uint32_t* spad = &words[pos];
        pos += ns_words;
#ifndef GA2_GATHER
        if (ns_words) return fail("an initial scratchpad needs a model built with gather=1", argv[1]);
#endif

        auto m = std::make_unique<Vga2>(ctx.get(), "ga2");
        m->clk = 0;
        m->start = 0;
        m->rom_we = 0;
        m->ext_we = 0;
        m->rst = 1;
        m->eval();
        edge(m.get());
        m->rst = 0;
        edge(m.get());

        m->rom_we = 1;
        for (uint32_t i = 0; i < ni; ++i) {
            m->rom_addr = i;
            for (int k = 0; k < 4; ++k) m->rom_wdata[k] = prog[4 * i + 3 - k];  // [0] is bits 31:0
            edge(m.get());
        }
        m->rom_we = 0;
        m->ext_we = 1;
        for (uint32_t i = 0; i < ext; ++i) {
            if (image[i] == 0) continue;   // already zero in a fresh model
            m->ext_addr = i;
            m->ext_wdata = image[i];
            edge(m.get());
        }
        m->ext_we = 0;
        m->ext_addr = 0;
#ifdef GA2_GATHER
        m->spad_we = 1;
        for (uint32_t i = 0; i < ns_words; ++i) {
            if (spad[i] == 0) continue;
            m->spad_addr = i;
            m->spad_wdata = spad[i];
            edge(m.get());
        }
        m->spad_we = 0;
        m->spad_addr = 0;
#endif

        auto t0 = std::chrono::steady_clock::now();
        bool failed = asserted(ctx.get(), j, -1);
        m->start = 1;
        if (!failed) edge(m.get());
        m->start = 0;
        uint64_t n = 0;
        failed = failed || asserted(ctx.get(), j, 0);
        // the sequencer's changes (a "GA2T" job file): what the cycle about to be clocked holds
        std::vector<uint32_t> changes;
        auto sample = [&]() {
            const size_t k = changes.size();
            if (k && changes[k - 2] == m->seq_state && changes[k - 1] == m->seq_pc) return;
            changes.push_back(m->cyc_total);
            changes.push_back(m->seq_state);
            changes.push_back(m->seq_pc);
        };
        if (traced) sample();
        while (!failed && !m->halted && n < max_cycles) {
            edge(m.get());
            ++n;
            failed = asserted(ctx.get(), j, (int64_t)n);
            if (traced) sample();
        }
        auto t1 = std::chrono::steady_clock::now();
        const uint64_t ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();

        out.push_back(m->halted ? 1u : 0u);
        out.push_back((uint32_t)n);
        out.push_back(m->cyc_total);
        out.push_back(m->cyc_mm);
        out.push_back(m->cyc_dma);
        out.push_back(m->cyc_vec);
        out.push_back(m->n_inst);
        out.push_back((uint32_t)ns);
        out.push_back((uint32_t)(ns >> 32));
#ifdef GA2_ERRORS
        out.push_back(m->error);
        out.push_back(m->error_kind);
        out.push_back(m->error_pc);
        out.push_back(m->error_info);
#else
        for (int k = 0; k < 4; ++k) out.push_back(0);
#endif
        out.push_back(m->seq_pc);
        out.push_back(m->seq_cur);
        out.push_back(m->seq_state);
        for (uint32_t i = 0; i < ext; ++i) {
            m->ext_addr = i;
            m->eval();   // ext_rdata is a combinational read: no edge needed
            out.push_back(m->ext_rdata);
        }
        for (uint32_t i = 0; i < GA2_SPAD; ++i) {
            m->spad_addr = i;
            m->eval();   // spad_rdata is a combinational read as well
            out.push_back(m->spad_rdata);
        }
        if (traced) {
            out.push_back((uint32_t)(changes.size() / 3));
            out.insert(out.end(), changes.begin(), changes.end());
        }
        m->final();
    }

    std::FILE* f = std::fopen(argv[2], "wb");
    if (!f) return fail("cannot write the result file", argv[2]);
    if (std::fwrite(out.data(), 4, out.size(), f) != out.size()) {
        std::fclose(f);
        return fail("short write", argv[2]);
    }
    std::fclose(f);
    return 0;
}
