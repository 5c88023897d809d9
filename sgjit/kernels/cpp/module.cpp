// The Python module: every kernel takes raw addresses and sizes (the Python side checks dtypes,
// shapes and strides and allocates the outputs), so this file, the only one that includes pybind11,
// builds in seconds without torch's Python headers. Each call is a named range ("sgjit::...") in
// torch.profiler traces; with no profiler on, that costs one thread-local check.
#include <ATen/record_function.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>

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

template <typename... Args>
static void def_kernel(pybind11::module_& m, const char* name, const char* range, void (*f)(Args...)) {
  m.def(name, [range, f](Args... args) {
    at::RecordFunction guard(at::RecordScope::USER_SCOPE);
    if (guard.isActive()) guard.before(range);
    f(std::forward<Args>(args)...);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", &sgjit::build_isa);
  def_kernel(m, "linear_panels", "sgjit::linear_panels", &sgjit::linear_panels);
  def_kernel(m, "rmsnorm", "sgjit::rmsnorm", &sgjit::rmsnorm);
  def_kernel(m, "add_rmsnorm", "sgjit::add_rmsnorm", &sgjit::add_rmsnorm);
  def_kernel(m, "silu_mul", "sgjit::silu_mul", &sgjit::silu_mul);
  def_kernel(m, "rope_store_kv", "sgjit::rope_store_kv", &sgjit::rope_store_kv);
  def_kernel(m, "attention", "sgjit::attention", &sgjit::attention);
}
