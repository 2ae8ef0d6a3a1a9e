// The `lora:` section (see lora_config.h); defaults follow PEFT's LoraConfig where Forge has the
// same knob (alpha 16 with rank 8 doubles the update, as in the LoRA paper's alpha = 2r examples).
#include "runtime/lora_config.h"

#include <algorithm>

#include "core/error.h"
#include "core/glob.h"

namespace forge {

ConfigSection lora_section() {
  return {"lora",
          "low-rank adapters (LoRA) on chosen Linear layers of a frozen base model",
          {section_key("lora.rank", integer_key(0, "[0, 65536]").aka({"r", "lora_r"}),
                       "adapter rank r; 0 = no adapters (every weight trains)"),
           section_key("lora.alpha", number_key(16.0, "> 0").aka({"lora_alpha"}),
                       "the adapters add (alpha / rank) * B A x to each targeted layer"),
           section_key("lora.dropout", number_key(0.0, "[0, 1)").aka({"lora_dropout"}),
                       "dropout on the input of the adapter branch only"),
           section_key("lora.targets",
                       string_list_key({"*.attn.*", "*.mlp.*"}).aka({"target_modules"}),
                       "glob patterns of Linear module paths that get adapters ('*' spans dots), "
                       "Hugging Face's names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                       "down_proj: that layer in every block) or all-linear (every Linear of the "
                       "blocks); the default adapts attention (attn.qkv or attn.q, attn.k, attn.v; "
                       "attn.proj) and the MLP"),
           section_key("lora.rslora", boolean_key(false).aka({"use_rslora"}),
                       "scale by alpha / sqrt(rank) (rsLoRA) instead of alpha / rank"),
           section_key("lora.lr_ratio", number_key(1.0, "> 0").aka({"loraplus_lr_ratio"}),
                       "LoRA+: B trains at this times the rate of A (1 = plain LoRA; the LoRA+ "
                       "paper suggests 16)"),
           section_key("lora.train_also", string_list_key().aka({"modules_to_save"}),
                       "glob patterns of further parameters that train beside the adapters, e.g. "
                       "[\"ln_f.*\"]")}};
}

LoRASection lora_settings(const RunConfig& config) {
  LoRASection s;
  s.rank = config.get<int64_t>("lora.rank");
  s.alpha = config.get<double>("lora.alpha");
  s.dropout = config.get<double>("lora.dropout");
  s.rslora = config.get<bool>("lora.rslora");
  s.targets = config.get<std::vector<std::string>>("lora.targets");
  s.lr_ratio = config.get<double>("lora.lr_ratio");
  s.train_also = config.get<std::vector<std::string>>("lora.train_also");
  return s;
}

std::vector<std::string> lora_trainable_patterns(const RunConfig& config) {
  std::vector<std::string> include = {"*.lora_A", "*.lora_B"};
  for (const std::string& p : lora_settings(config).train_also) include.push_back(p);
  return include;
}

std::vector<std::pair<std::string, double>> lora_lr_scale(const RunConfig& config) {
  const LoRASection s = lora_settings(config);
  if (s.rank == 0 || s.lr_ratio == 1.0) return {};
  return {{"*.lora_B", s.lr_ratio}};
}

int64_t lora_trainable_parameters(const nn::GPTConfig& model, const RunConfig& config) {
  const std::vector<nn::ParameterShape> params = nn::gpt_parameter_shapes(model);
  const LoRASection lora = lora_settings(config);
  const std::vector<std::string>& also = lora.train_also;
  for (const std::string& pattern : also)
    if (std::none_of(params.begin(), params.end(),
                     [&](const nn::ParameterShape& p) { return glob_match(pattern, p.name); }))
      throw Error(ExitCode::usage, "lora.train_also: '" + pattern +
                                       "' matches no parameter of the model (names such as '" +
                                       params.back().name + "', 'blocks.0.ln1.weight')");
  int64_t n = nn::lora_parameter_count(model, lora);
  for (const nn::ParameterShape& p : params)
    if (std::any_of(also.begin(), also.end(),
                    [&](const std::string& pattern) { return glob_match(pattern, p.name); }))
      n += shape_numel(p.shape);
  return n;
}

void check_lora(ConfigChecker& checker) {
  const LoRASection s = lora_settings(checker.config());
  checker.cross({"lora.targets", "lora.rank"}, s.rank == 0 || !s.targets.empty(),
                "lora.targets: lora.rank > 0 needs at least one pattern of Linear layers");
  // Both act on adapters only: without them they would be ignored, silently.
  const bool adapters = s.rank > 0;
  checker.cross({"lora.lr_ratio", "lora.rank"}, adapters || s.lr_ratio == 1.0,
                "lora.lr_ratio: sets the rate of the adapters' B, but lora.rank is 0 (no "
                "adapters; every weight trains at optimizer.lr)");
  checker.cross({"lora.train_also", "lora.rank"},
                adapters || s.train_also.empty(),
                "lora.train_also: names what trains beside the adapters, but lora.rank is 0 (no "
                "adapters; every weight trains)");
}

}  // namespace forge
