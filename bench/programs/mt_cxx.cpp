// hetmem benchmarks — a multithreaded C++ program for whole-program timing
// and trace recording. SPDX-License-Identifier: MIT
//
//   bench_prog_cxx [THREADS [ROUNDS]]   (defaults 2 and 1500)
//
// Each thread, per round: builds an unordered_map of strings to vectors,
// sorts a vector of strings, and sends a batch of heap-allocated messages
// (std::string payloads of mixed sizes) to the next thread through a
// mutex-protected queue; the receiver reads and destroys them, so blocks are
// freed by a thread other than the one that made them. Prints a checksum.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

struct Message {
    std::string payload;
    std::vector<uint32_t> values;
};

struct Mailbox {
    std::mutex lock;
    std::condition_variable ready;
    std::deque<std::unique_ptr<Message>> queue;
    int batches = 0; // batches ever sent to this box
};

uint64_t next_random(uint64_t &s) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

// Takes every message in box, after waiting until at least `want` batches
// have been sent to it.
uint64_t drain(Mailbox &box, int want) {
    std::deque<std::unique_ptr<Message>> got;
    {
        std::unique_lock<std::mutex> g(box.lock);
        box.ready.wait(g, [&] { return box.batches >= want; });
        got.swap(box.queue);
    }
    uint64_t sum = 0;
    for (auto &m : got) sum += m->payload.size() + (m->values.empty() ? 0 : m->values.back());
    return sum; // the messages die here, in the receiving thread
}

uint64_t worker(int self, int threads, int rounds, std::vector<Mailbox> &boxes) {
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(self + 1), sum = 0;
    Mailbox &next = boxes[(size_t)((self + 1) % threads)];
    for (int r = 0; r < rounds; r++) {
        std::unordered_map<std::string, std::vector<int>> index;
        for (int i = 0; i < 400; i++) {
            std::string key = "key-" + std::to_string(next_random(seed) % 1000);
            index[key].push_back(i);
        }
        std::vector<std::string> words;
        for (auto &kv : index) words.push_back(kv.first + ":" + std::to_string(kv.second.size()));
        std::sort(words.begin(), words.end());
        sum += words.size() + words.front().size();
        std::vector<std::unique_ptr<Message>> batch;
        for (int i = 0; i < 200; i++) {
            auto m = std::make_unique<Message>();
            m->payload.assign(8 + next_random(seed) % 500, 'a' + (char)(i % 26));
            m->values.resize(1 + next_random(seed) % 64, (uint32_t)i);
            batch.push_back(std::move(m));
        }
        {
            std::lock_guard<std::mutex> g(next.lock);
            for (auto &m : batch) next.queue.push_back(std::move(m));
            next.batches++;
        }
        next.ready.notify_one();
        sum += drain(boxes[(size_t)self], r + 1);
    }
    return sum;
}

} // namespace

int main(int argc, char **argv) {
    int threads = argc > 1 ? std::atoi(argv[1]) : 2;
    int rounds = argc > 2 ? std::atoi(argv[2]) : 1500;
    if (threads < 1 || threads > 64 || rounds < 1) {
        std::fprintf(stderr, "usage: bench_prog_cxx [THREADS 1..64 [ROUNDS]]\n");
        return 2;
    }
    std::vector<Mailbox> boxes((size_t)threads);
    std::vector<uint64_t> sums((size_t)threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back([&, t] { sums[(size_t)t] = worker(t, threads, rounds, boxes); });
    for (auto &t : pool) t.join();
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) total += sums[(size_t)t] + drain(boxes[(size_t)t], 0);
    std::printf("checksum %llu\n", (unsigned long long)total);
    return 0;
}
