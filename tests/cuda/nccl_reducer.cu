// precis::nccl_reducer on one process and one device (a communicator of one): the
// found-inf flag and amaxes come back as given, device gradients are averaged in place
// (unchanged over one process), the bytes are counted, and a null communicator is refused.
// Exits 77 (skipped) where no GPU is present. Two processes need two GPUs; not here.
#include <precis/distributed/nccl.hpp>

#include "../gpu.hpp"

#include <cstdio>
#include <span>
#include <vector>

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  int failures = 0;
  const auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::printf("FAILED: %s\n", what);
    }
  };
  try {
    precis::cuda_context ctx(0);
    ncclComm_t comm = nullptr;
    int device = 0;
    precis::check(ncclCommInitAll(&comm, 1, &device), "ncclCommInitAll");
    {
      precis::nccl_reducer r(comm, ctx);
      expect(r.rank() == 0 && r.size() == 1, "rank 0 of 1");
      expect(r.any(true) && !r.any(false), "any");
      std::vector<float> amax{3.0f, 0.5f};
      r.max(amax);
      expect(amax[0] == 3.0f && amax[1] == 0.5f, "max");
      const std::vector<float> host{1.5f, -2.0f, 0.25f};
      float* d = nullptr;
      precis::check(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(float)),
                    "cudaMalloc");
      precis::check(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                    "cudaMemcpy");
      std::vector<precis::device_span<float>> grads{precis::device_span<float>(d, host.size())};
      r.average(grads);
      std::vector<float> back(host.size());
      precis::check(cudaStreamSynchronize(ctx.stream()), "cudaStreamSynchronize");
      precis::check(cudaMemcpy(back.data(), d, back.size() * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy");
      expect(back == host, "average over one process");
      expect(r.gradient_bytes() == host.size() * sizeof(float), "bytes");
      cudaFree(d);
    }
    try {
      precis::nccl_reducer bad(nullptr, ctx);
      expect(false, "a null communicator was accepted");
    } catch (const precis::error&) {
    }
    ncclCommDestroy(comm);
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  if (failures != 0) std::printf("nccl_reducer: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
