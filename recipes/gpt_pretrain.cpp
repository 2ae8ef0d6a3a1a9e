// gpt_pretrain, top to bottom: data, model, optimizer, then the language-model objective of
// recipes/lm_objective.h: summed next-token cross-entropy per micro-batch, and validation loss over
// evenly spread (periodic) or all (final) windows.
#include "recipes/gpt_pretrain.h"

#include <filesystem>

#include "core/autograd.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

MemoryEstimate estimate_gpt(const RunConfig& config) {
  nn::GPTConfig g = gpt_config(config.model);
  nn::check_config(g);
  int64_t params = nn::gpt_num_parameters(g);
  return estimate_memory(config, params, params,
                         double(config.train.batch_size * config.model.context));
}

}  // namespace

RecipeSpec gpt_pretrain_recipe() {
  return {.name = "gpt_pretrain",
          .doc = "a GPT trained with next-token cross-entropy",
          .families = {"gpt"},
          .sections = {},
          .check = check_model_family,
          .train = train_gpt,
          .eval = [](const RunConfig& config, const std::filesystem::path& checkpoint,
                     const CommandOptions&) {
            return eval_gpt(config, checkpoint.string());
          },
          .estimate = estimate_gpt};
}

int train_gpt(const RunConfig& config) {
  LMSplits data = load_lm_splits(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::GPT model(gpt_config(config.model), init);
  init_weights(model, config);
  model.set_activation_checkpointing(config.train.activation_checkpointing);
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, model.named_parameters());

  const int64_t B = config.train.batch_size;
  Recipe recipe;
  recipe.tokens_per_step = B * config.model.context * config.train.grad_accum;
  recipe.micro_batch = [&](int64_t step, int64_t micro) {
    return lm_loss(model, data.train->sample(B, uint64_t(config.seed), step, micro));
  };
  recipe.evaluate = [&](bool full) {
    return lm_eval(model, *data.val, B, config.train.eval_batches, full);
  };
  recipe.sample = [&] { return sample_text(model, *data.tokenizer, "\n", config); };
  return run_training(config, model, *optimizer, recipe);
}

int eval_gpt(const RunConfig& config, const std::string& checkpoint_file) {
  LoadedGPT loaded = load_gpt(checkpoint_file);
  LMSplits data = load_lm_splits(config);
  NoGradGuard no_grad;
  Metrics m = lm_eval(*loaded.model, *data.val, config.train.batch_size, 0, true);
  print_eval(checkpoint_file, loaded.step, m);
  return 0;
}

}  // namespace forge
