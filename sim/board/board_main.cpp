// ga2board: the GA-2 board top (hdl.board_top.BoardTop) in Verilator, its serial line simulated bit by bit.
//
// Usage: ga2board < host-bytes > board-bytes  (sim/board/verilated.py runs it between a pseudo-terminal
// and the board). Every byte read from stdin is sent to the board's `rx` pin as an 8N1 frame with the
// timing of the board's own transmitter (hdl.uart.tx_edge: bit k of a frame from cycle
// floor(k * GA2_CLK_HZ / GA2_BAUD), frames back to back while bytes wait); the board's `tx` pin is
// decoded like its own receiver does (hdl.uart.rx_sample: a falling edge, then samples at
// floor((2k + 1) * GA2_CLK_HZ / (2 * GA2_BAUD)) cycles after it, a high stop bit delivers the byte) and
// each byte goes to stdout.
//
// When nothing happens (no byte waiting or on either line, no RUN in progress: LED 3 low) for longer
// than the board's frame-gap timer (hdl.link_engine.gap_cycles, GA2_GAP, plus two frames), the simulation
// stops clocking and blocks until stdin has bytes again: an idle board costs no CPU. A frame cut short
// is still dropped by the board, since the gap's cycles are simulated before the wait.
//
// With GA2BOARD_DEBUG set in its environment it also says on stderr when it goes idle and when the
// LEDs change (with the cycle).
//
// At the end of stdin it prints one line on stderr: `ga2board: runs R cycles C bytes_in I bytes_out O
// framing_errors F`, R counting the RUNs the board executed (rising edges of LED 3, the RUN-in-progress
// light: a repeated RUN that the board answers from its stored result does not light it).
#include <poll.h>
#include <unistd.h>
#include <fcntl.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

#include "verilated.h"
#include "Vboard.h"

#ifndef GA2_CLK_HZ
#error "GA2_CLK_HZ (the board's clock) must be defined"
#endif
#ifndef GA2_BAUD
#error "GA2_BAUD (the line's rate) must be defined"
#endif
#ifndef GA2_GAP
#error "GA2_GAP (the board's frame-gap timer in cycles) must be defined"
#endif

static const int LED_RUNNING = 3;
static const uint64_t POLL_EVERY = 1024;        // cycles between looks at stdin while simulating

static inline void edge(Vboard* m) {
    m->clk = 1;
    m->eval();
    m->clk = 0;
    m->eval();
}

// floor(k * clk / baud): hdl.uart.tx_edge
static uint64_t tx_edge(int k) { return (uint64_t)k * GA2_CLK_HZ / GA2_BAUD; }
// floor((2k + 1) * clk / (2 baud)): hdl.uart.rx_sample
static uint64_t rx_sample(int k) { return (uint64_t)(2 * k + 1) * GA2_CLK_HZ / (2ull * GA2_BAUD); }

static bool write_all(const std::vector<uint8_t>& buf) {
    size_t done = 0;
    while (done < buf.size()) {
        ssize_t n = write(1, buf.data() + done, buf.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        done += (size_t)n;
    }
    return true;
}

int main(int argc, char** argv) {
    (void)argc;
    (void)argv;
    uint64_t edges[11], samples[10];
    for (int k = 0; k <= 10; ++k) edges[k] = tx_edge(k);
    for (int k = 0; k < 10; ++k) samples[k] = rx_sample(k);
    const uint64_t idle_limit = GA2_GAP + 2 * edges[10] + 64;

    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);

    auto ctx = std::make_unique<VerilatedContext>();
    auto m = std::make_unique<Vboard>(ctx.get(), "board");
    m->clk = 0;
    m->rx = 1;
    m->rst = 1;
    m->eval();
    edge(m.get());
    m->rst = 0;

    std::deque<uint8_t> inq;
    std::vector<uint8_t> outbuf;
    bool eof = false;
    uint64_t frames_sent = 0;
    uint64_t cycle = 0, bytes_in = 0, bytes_out = 0, runs = 0, framing = 0;
    // the host's transmitter (our rx driver)
    bool sending = false;
    uint8_t cur = 0;
    int bitk = 0;
    uint64_t frame_start = 0, rx_last = 0;
    // the host's receiver (our tx decoder)
    enum { HUNT, RECV, WAIT_HIGH } rstate = HUNT;
    uint64_t rstart = 0, tx_last = 0;
    int rk = 0;
    uint8_t shift = 0;
    bool was_running = false;
    uint64_t run_last = 0;                      // the last cycle a RUN was in progress (its answer follows)
    uint64_t next_poll = 0;
    const bool debug = getenv("GA2BOARD_DEBUG") != nullptr;
    unsigned last_leds = 0;

    auto take_input = [&](int timeout_ms) {
        struct pollfd p = {0, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r <= 0) return;
        uint8_t buf[65536];
        for (;;) {
            ssize_t n = read(0, buf, sizeof buf);
            if (n > 0) {
                inq.insert(inq.end(), buf, buf + n);
                bytes_in += (uint64_t)n;
                continue;
            }
            if (n == 0) eof = true;
            else if (errno == EINTR) continue;
            break;                              // EAGAIN: all that was there
        }
    };

    while (true) {
        if (cycle >= next_poll || (!sending && inq.empty())) {
            if (cycle >= next_poll || !eof) take_input(0);
            next_poll = cycle + POLL_EVERY;
        }
        const bool running = (m->leds >> LED_RUNNING) & 1;
        if (debug && m->leds != last_leds) {
            std::fprintf(stderr, "leds %u -> %u at %llu (rx_last %llu)\n", last_leds, (unsigned)m->leds,
                         (unsigned long long)cycle, (unsigned long long)rx_last);
            last_leds = m->leds;
        }
        if (running && !was_running) ++runs;
        was_running = running;
        if (running) run_last = cycle;
        // idle: flush, and block until the host sends something (or stop at the end of its bytes)
        if (!sending && inq.empty() && !running && rstate == HUNT && cycle - rx_last >= idle_limit &&
            cycle - tx_last >= idle_limit && cycle - run_last >= idle_limit) {
            if (!outbuf.empty()) {
                if (!write_all(outbuf)) break;
                outbuf.clear();
            }
            if (eof) break;
            if (debug) std::fprintf(stderr, "idle at %llu rx_last %llu tx_last %llu leds %u in %llu sent %llu\n",
                                    (unsigned long long)cycle, (unsigned long long)rx_last,
                                    (unsigned long long)tx_last, (unsigned)m->leds, (unsigned long long)bytes_in,
                                    (unsigned long long)frames_sent);
            take_input(-1);
            if (inq.empty() && eof) break;
            continue;
        }

        // the line into the board
        if (sending && cycle - frame_start >= edges[10]) sending = false;
        if (!sending && !inq.empty()) {
            cur = inq.front();
            inq.pop_front();
            ++frames_sent;
            sending = true;
            frame_start = cycle;
            bitk = 0;
        }
        int level = 1;
        if (sending) {
            const uint64_t t = cycle - frame_start;
            while (bitk < 9 && t >= edges[bitk + 1]) ++bitk;
            level = bitk == 0 ? 0 : bitk == 9 ? 1 : (cur >> (bitk - 1)) & 1;
            rx_last = cycle;
        }
        m->rx = level;
        edge(m.get());
        ++cycle;

        // the line out of the board
        const int tx = m->tx & 1;
        switch (rstate) {
        case HUNT:
            if (!tx) {
                rstate = RECV;
                rstart = cycle;
                rk = 0;
                shift = 0;
            }
            break;
        case RECV: {
            const uint64_t t = cycle - rstart;
            if (t == samples[rk]) {
                if (rk == 0) {
                    if (tx) rstate = HUNT;          // a glitch, not a start bit
                } else if (rk <= 8) {
                    shift |= (uint8_t)(tx << (rk - 1));
                } else {
                    if (tx) {
                        outbuf.push_back(shift);
                        ++bytes_out;
                        rstate = HUNT;
                    } else {
                        ++framing;
                        rstate = WAIT_HIGH;
                    }
                }
                ++rk;
            }
            break;
        }
        case WAIT_HIGH:
            if (tx) rstate = HUNT;
            break;
        }
        if (!tx || rstate != HUNT) tx_last = cycle;
        // hand finished bytes over once the board pauses (two frame times) or the buffer is large
        if (!outbuf.empty() && (outbuf.size() >= 4096 || cycle - tx_last >= 2 * edges[10])) {
            if (!write_all(outbuf)) break;
            outbuf.clear();
        }
    }
    m->final();
    std::fprintf(stderr, "ga2board: runs %llu cycles %llu bytes_in %llu bytes_out %llu framing_errors %llu\n",
                 (unsigned long long)runs, (unsigned long long)cycle, (unsigned long long)bytes_in,
                 (unsigned long long)bytes_out, (unsigned long long)framing);
    return 0;
}
