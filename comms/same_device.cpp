#include "comms/same_device.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comms/matched_group.hpp"
#include "cuda/kernels.hpp"
#include "cuda/resources.hpp"

namespace dpactor {
namespace {

// After an abort, how long the group's stream may take to pass the work
// carried out before it (copies and additions: microseconds to
// milliseconds) before stderr hears of it.
constexpr auto drain_bound = std::chrono::seconds(30);

bool on_host(const void* p) {
  cudaPointerAttributes attr{};
  const bool host = cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
                    attr.type == cudaMemoryTypeUnregistered;
  cudaGetLastError();
  return host;
}

class device_carrier final : public call_carrier {
 public:
  // Made with `device` current (make_same_device_group).
  explicit device_carrier(int device) : device_(device) {}

  // Whatever was enqueued is covered by done_, also when a call fails
  // half-way (drain() waits for it).
  void carry_out(std::size_t seq, matched_call& c) override {
    device_guard guard(device_);
    try {
      enqueue(c);
    } catch (...) {
      done_.record(stream_.get());
      last_ = seq;
      throw;
    }
    done_.record(stream_.get());
    last_ = seq;
  }

  // The stream runs calls in order: once the last one carried out is done,
  // so is every earlier one.
  bool finished(std::size_t seq) override {
    if (seq < done_through_) return true;
    device_guard guard(device_);
    if (!done_.done()) return false;
    done_through_ = last_ + 1;
    return seq < done_through_;
  }

  // See Note [Posted memory outlives an abort]: no rank may return into
  // memory this stream may still copy into, so this waits until the stream
  // has passed everything enqueued; a GPU that does not get there in
  // drain_bound is said on stderr, and waited for still.
  void drain() noexcept override {
    try {
      device_guard guard(device_);
      wait_for_stream();
    } catch (...) {  // the device failed: no work of this group runs any more
    }
  }

 private:
  void wait_for_stream() {
    cuda_event passed;
    passed.record(stream_.get());
    bool said = false;
    const auto start = std::chrono::steady_clock::now();
    while (!passed.done()) {
      if (!said && std::chrono::steady_clock::now() - start > drain_bound) {
        std::fprintf(stderr, "dpactor: same_device collective: the GPU has not finished a copy for %lld s; waiting\n",
                     static_cast<long long>(drain_bound.count()));
        said = true;
      }
      std::this_thread::yield();
    }
  }

  // Grows a scratch buffer; calls still queued (gradient buckets) may read
  // the old one, so the stream passes them first.
  void reserve(device_buffer<float>& b, std::size_t n) {
    if (b.size() >= n) return;
    wait_for_stream();
    b = device_buffer<float>(n);
  }

  void enqueue(matched_call& c) {
    const std::size_t ranks = c.data.size();
    const cudaStream_t s = stream_.get();
    const auto bytes = [](std::size_t n) { return n * sizeof(float); };
    if (c.kind == 'r' && c.n > 0 && on_host(c.data[0])) {  // the step header: summed here, at once
      std::vector<float> sum(c.n, 0.0f);
      for (std::size_t k = 0; k < ranks; ++k)
        for (std::size_t i = 0; i < c.n; ++i) sum[i] += c.data[k][i];
      for (std::size_t k = 0; k < ranks; ++k) std::copy(sum.begin(), sum.end(), c.data[k]);
    } else if (c.kind == 'r' && c.n > 0) {
      // A gradient bucket may still be in the making on its replica's
      // stream: this stream waits for each, on the GPU.
      for (std::size_t k = 0; k < ranks; ++k)
        if (c.after[k] != nullptr) {
          produced_.record(static_cast<cudaStream_t>(c.after[k]));
          CUDA_CHECK(cudaStreamWaitEvent(s, produced_.get(), 0));
        }
      reserve(sum_, c.n);
      CUDA_CHECK(cudaMemcpyAsync(sum_.data(), c.data[0], bytes(c.n), cudaMemcpyDeviceToDevice, s));
      for (std::size_t k = 1; k < ranks; ++k) cuda::add_into(sum_.data(), c.data[k], c.n, s);  // rank order
      for (std::size_t k = 0; k < ranks; ++k)
        CUDA_CHECK(cudaMemcpyAsync(c.data[k], sum_.data(), bytes(c.n), cudaMemcpyDeviceToDevice, s));
    } else if (c.kind == 'b' && c.n > 0) {
      const float* from = c.data[static_cast<std::size_t>(c.root)];
      for (std::size_t k = 0; k < ranks; ++k)
        if (static_cast<int>(k) != c.root)
          CUDA_CHECK(cudaMemcpyAsync(c.data[k], from, bytes(c.n), cudaMemcpyDefault, s));
    } else if (c.kind == 'g') {
      for (std::size_t b = 0; b < c.n; ++b)
        for (std::size_t from = 0; from < ranks; ++from) {
          const auto [begin, end] = c.chunks[b * ranks + from];
          for (std::size_t to = 0; to < ranks; ++to)
            if (to != from && end > begin)
              CUDA_CHECK(cudaMemcpyAsync(c.buffers[to][b].data() + begin, c.buffers[from][b].data() + begin,
                                         bytes(end - begin), cudaMemcpyDefault, s));
        }
    } else if (c.kind == 't' && c.n > 0) {
      // The parts read in place; the root evaluated once, then copied to
      // every rank (an out may be a part another rank's value reads).
      const std::size_t parts = c.roots.size();
      const std::size_t table = parts * sizeof(float*) + c.steps.size() * sizeof(tree_step);
      if (!done_.done()) wait_for_stream();  // the last table's copy may still read the pinned one
      if (table_host_.size() < table) {
        table_host_ = pinned_buffer<unsigned char>(table);
        table_ = device_buffer<unsigned char>(table);
      }
      auto* pointers = reinterpret_cast<const float**>(table_host_.data());
      for (std::size_t i = 0; i < parts; ++i) pointers[i] = c.own[static_cast<std::size_t>(c.roots[i])][i];
      std::memcpy(table_host_.data() + parts * sizeof(float*), c.steps.data(), c.steps.size() * sizeof(tree_step));
      CUDA_CHECK(cudaMemcpyAsync(table_.data(), table_host_.data(), table, cudaMemcpyHostToDevice, s));
      reserve(sum_, c.n);
      cuda::run_tree_program(reinterpret_cast<const tree_step*>(table_.data() + parts * sizeof(float*)),
                             c.steps.size(), reinterpret_cast<const float* const*>(table_.data()), c.n, sum_.data(), s);
      for (std::size_t k = 0; k < ranks; ++k)
        CUDA_CHECK(cudaMemcpyAsync(c.data[k], sum_.data(), bytes(c.n), cudaMemcpyDeviceToDevice, s));
    }
  }

  int device_;
  cuda_stream stream_;
  cuda_event done_;      // recorded after each call carried out
  cuda_event produced_;  // a bucket's replica stream, waited for on stream_
  std::size_t last_ = 0;          // the last call carried out
  std::size_t done_through_ = 0;  // calls below this number are finished
  device_buffer<float> sum_;
  pinned_buffer<unsigned char> table_host_;
  device_buffer<unsigned char> table_;
};

}  // namespace

std::shared_ptr<collective_group> make_same_device_group(int ranks, int device) {
  device_guard on_device(device);  // the carrier's stream and events live there
  return make_matched_group(ranks, std::make_shared<device_carrier>(device));
}

}  // namespace dpactor
