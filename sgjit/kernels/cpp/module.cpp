// The Python module: every kernel takes raw addresses and sizes (the Python side checks dtypes,
// shapes and strides and allocates the outputs), so this file, the only one that includes pybind11,
// builds in seconds without torch's Python headers.
#include <pybind11/pybind11.h>

#include <cstdint>

namespace sgjit {
void linear_panels(int64_t x, bool x_bf16, int64_t M, int64_t K, int64_t ldx, int64_t w, int bits,
                   bool half_scales, int64_t N, int64_t bias, int64_t y, bool y_bf16, int64_t ldy);
void rmsnorm(int64_t x, bool bf16, int64_t rows, int64_t D, int64_t ldx, int64_t w, double eps, int64_t out);
void add_rmsnorm(int64_t x, int64_t res, bool bf16, int64_t rows, int64_t D, int64_t w, double eps, int64_t out,
                 int64_t summed);
void silu_mul(int64_t x, bool bf16, int64_t rows, int64_t I, int64_t out);
void rope_store_kv(int64_t q, int64_t sq, int64_t k, int64_t sk, int64_t v, int64_t sv, bool bf16, int64_t cos_sin,
                   int64_t R, int64_t slots, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kpool,
                   int64_t vpool, int64_t out);
void attention(int64_t q, int64_t sq, bool bf16, int64_t kpool, int64_t vpool, int64_t page_size, int64_t hkv,
               int64_t D, int64_t table, int64_t table_stride, int64_t qo, int64_t kv_lens, int64_t B, int64_t Hq,
               double scale, int64_t out);
const char* build_isa();
}  // namespace sgjit

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", &sgjit::build_isa);
  m.def("linear_panels", &sgjit::linear_panels);
  m.def("rmsnorm", &sgjit::rmsnorm);
  m.def("add_rmsnorm", &sgjit::add_rmsnorm);
  m.def("silu_mul", &sgjit::silu_mul);
  m.def("rope_store_kv", &sgjit::rope_store_kv);
  m.def("attention", &sgjit::attention);
}
