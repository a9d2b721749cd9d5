// hetmem tests — a C++ program for the malloc replacement: new/delete of
// objects handed between threads, containers, strings. Prints a checksum that
// must be the same with and without LD_PRELOAD. SPDX-License-Identifier: MIT
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

struct Node {
    std::string name;
    std::vector<uint64_t> data;
    explicit Node(uint64_t i) : name("node-" + std::to_string(i)), data(i % 97 + 1, i) {}
};

int main() {
    std::mutex lock;
    std::queue<std::unique_ptr<Node>> q;
    uint64_t sum = 0;
    std::vector<std::thread> producers, consumers;
    const int per = 20000;
    for (int t = 0; t < 2; t++)
        producers.emplace_back([&, t] {
            for (int i = 0; i < per; i++) {
                auto n = std::make_unique<Node>((uint64_t)(t * per + i));
                std::lock_guard<std::mutex> g(lock);
                q.push(std::move(n));
            }
        });
    for (int t = 0; t < 2; t++)
        consumers.emplace_back([&] {
            std::map<std::string, uint64_t> seen;
            for (int got = 0; got < per;) {
                std::unique_ptr<Node> n;
                {
                    std::lock_guard<std::mutex> g(lock);
                    if (q.empty()) continue;
                    n = std::move(q.front());
                    q.pop();
                }
                uint64_t s = 0;
                for (uint64_t v : n->data) s += v;
                seen[n->name] = s;
                got++;
            }
            uint64_t local = 0;
            for (auto &kv : seen) local += kv.second + kv.first.size();
            std::lock_guard<std::mutex> g(lock);
            sum += local;
        });
    for (auto &t : producers) t.join();
    for (auto &t : consumers) t.join();
    std::printf("checksum %llu\n", (unsigned long long)sum);
    return 0;
}
