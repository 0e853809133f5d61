// torch extension for the sm90 W8A8 kernels: operand checks, output allocation, the
// workspace (none for these kernels: no allocation then), the current stream, then the
// launcher of w8a8_sm90.cu. Tile and swizzle choice by shape live in w8a8_sm90_select.h
// (w8a8_sm90_default_tile / _swizzle); they never change the bits.
// Shape policy (alignment, empty inputs, K = 0) is handled in kernels/cutlass/__init__.py;
// this file re-checks what the kernel relies on so a direct call cannot corrupt memory.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "w8a8_sm90.h"

namespace {

void check_operand(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t rows, int64_t cols) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has the wrong dtype ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, name, " has shape ", t.sizes(),
              ", expected [", rows, ", ", cols, "]");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned (TMA)");
}

torch::Tensor scaled_mm(torch::Tensor a, torch::Tensor w, torch::Tensor s_a, torch::Tensor s_w, int64_t tile, int64_t swizzle) {
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0);
  check_operand(a, "a", torch::kInt8, m, k);
  check_operand(w, "w", torch::kInt8, n, k);
  TORCH_CHECK(s_a.is_cuda() && s_a.scalar_type() == torch::kFloat32 && s_a.numel() == m && s_a.is_contiguous(),
              "s_a must be a contiguous fp32 CUDA tensor of ", m, " elements");
  TORCH_CHECK(s_w.is_cuda() && s_w.scalar_type() == torch::kFloat32 && s_w.numel() == n && s_w.is_contiguous(),
              "s_w must be a contiguous fp32 CUDA tensor of ", n, " elements");
  TORCH_CHECK(k > 0 && k % 16 == 0, "K must be a positive multiple of 16 (TMA row alignment), got ", k);
  TORCH_CHECK(n > 0 && n % 8 == 0, "N must be a positive multiple of 8 (bf16 output TMA alignment), got ", n);
  TORCH_CHECK(m > 0 && m <= INT32_MAX && n <= INT32_MAX, "M must be in [1, 2^31)");
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = torch::empty({m, n}, a.options().dtype(torch::kBFloat16));
  if (tile < 0) tile = requant::w8a8_sm90_default_tile(static_cast<int>(m), static_cast<int>(n));
  TORCH_CHECK(tile < requant::kW8A8NumTiles, "unknown tile config ", tile);
  if (swizzle < 1)
    swizzle = requant::w8a8_sm90_default_swizzle(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                                 static_cast<int>(tile));
  requant::W8A8Problem p{a.data_ptr<int8_t>(), w.data_ptr<int8_t>(), s_a.data_ptr<float>(), s_w.data_ptr<float>(),
                         reinterpret_cast<uint16_t*>(out.data_ptr()), static_cast<int>(m), static_cast<int>(n),
                         static_cast<int>(k), static_cast<int>(swizzle)};
  const size_t ws_bytes = requant::w8a8_sm90_workspace(static_cast<int>(tile), p);
  torch::Tensor ws;  // the persistent data-parallel scheduler needs none: no allocation per call then
  if (ws_bytes) ws = torch::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(torch::kUInt8));
  const int status = requant::w8a8_sm90_run(static_cast<int>(tile), p, ws_bytes ? ws.data_ptr() : nullptr,
                                            c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == requant::kW8A8Ok, "CUTLASS W8A8 kernel (", requant::w8a8_sm90_tile_name(static_cast<int>(tile)),
              ") failed with status ", status, " for M=", m, " N=", n, " K=", k);
  return out;
}

std::string tile_name(int64_t tile) { return requant::w8a8_sm90_tile_name(static_cast<int>(tile)); }
int64_t default_tile(int64_t m, int64_t n) {
  return requant::w8a8_sm90_default_tile(static_cast<int>(m), static_cast<int>(n));
}
int64_t default_swizzle(int64_t m, int64_t n, int64_t k, int64_t tile) {
  return requant::w8a8_sm90_default_swizzle(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                            static_cast<int>(tile));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("scaled_mm", &scaled_mm, "bf16 [M,N] = bf16_rne(s_a * fp32(s_w * fp32(a @ w^T))) on sm90a",
          py::arg("a"), py::arg("w"), py::arg("s_a"), py::arg("s_w"), py::arg("tile") = -1, py::arg("swizzle") = -1);
  mod.def("tile_name", &tile_name);
  mod.def("default_tile", &default_tile);
  mod.def("default_swizzle", &default_swizzle);
  mod.attr("num_tiles") = requant::kW8A8NumTiles;
}
