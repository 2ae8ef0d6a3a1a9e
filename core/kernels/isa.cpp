#include "core/kernels/isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <string>
#include <utility>

namespace forge::kernels {

const char* kernel_isa() {
  __builtin_cpu_init();
  if (kAvx512Built && __builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "x86-64";
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  // The widest ISA oneDNN dispatches to after ONEDNN_MAX_CPU_ISA. The values are bit sets that
  // contain the narrower ones, so the first that is wholly present is the answer.
  static constexpr std::pair<dnnl_cpu_isa_t, const char*> kNames[] = {
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
      {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
      {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
      {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx, "avx"}};
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const char* name = "sse41";
  for (const auto& [bits, n] : kNames)
    if ((isa & unsigned(bits)) == unsigned(bits)) {
      name = n;
      break;
    }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ", " + name;
}

}  // namespace forge::kernels
