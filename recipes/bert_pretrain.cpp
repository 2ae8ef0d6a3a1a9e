// bert_pretrain, top to bottom: the data and objective of recipes/bert_objective.h (documents of
// sentences, the pair sampler with dynamic masking, MLM cross-entropy averaged over the chosen
// positions plus NSP cross-entropy averaged over the pairs, evaluation on a fixed set of validation
// pairs), the model, and a step that keeps that mean exact under gradient accumulation.
#include "recipes/bert_pretrain.h"

#include <algorithm>
#include <filesystem>

#include "core/ops.h"
#include "nn/bert.h"
#include "recipes/bert_objective.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

// Rules of the recipe besides the bert family's (components.h): the pair format needs its specials.
void check_bert_pretrain(ConfigChecker& checker) {
  check_model_family(checker);
  check_bert_specials(checker, "bert_pretrain");
}

// The MLM head runs on the chosen positions only (~mask_prob of the tokens).
MemoryEstimate estimate_bert(const RunConfig& config) {
  nn::BertConfig b = bert_config(config);
  nn::check_config(b);
  int64_t params = nn::bert_num_parameters(b);
  double tokens = double(config.train.batch_size * config.model.context);
  return estimate_memory(config, params, params, tokens * bert_settings(config).mask_prob);
}

}  // namespace

RecipeSpec bert_pretrain_recipe() {
  return {.name = "bert_pretrain",
          .doc = "a BERT encoder pre-trained with masked-LM plus next-sentence prediction",
          .families = {"bert"},
          .sections = {"bert"},
          .check = check_bert_pretrain,
          .train = train_bert,
          .eval = [](const RunConfig& config, const std::filesystem::path& checkpoint,
                     const CommandOptions&) {
            return eval_bert(config, checkpoint.string());
          },
          .estimate = estimate_bert};
}

int train_bert(const RunConfig& config) {
  BertData data = load_bert_data(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::Bert model(bert_config(config), init);
  init_weights(model, config);
  model.set_activation_checkpointing(config.train.activation_checkpointing);
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, model.named_parameters());

  const int64_t B = config.train.batch_size, accum = config.train.grad_accum;
  const auto seed = uint64_t(config.seed);
  // The loss is mean MLM over all chosen positions of the step plus mean NSP over its pairs. The
  // trainer divides summed losses by summed targets (here: pairs), so each micro-batch scales its
  // MLM sum by pairs / chosen positions of the whole step, which needs the step's batches first
  // (all of them, also under mpirun, where a rank runs only some).
  std::vector<BertBatch> step_batches;
  int64_t batches_step = -1;
  double mlm_scale = 0.0;
  Recipe recipe;
  recipe.tokens_per_step = B * config.model.context * accum;
  recipe.micro_batch = [&](int64_t step, int64_t micro) {
    if (step != batches_step) {
      batches_step = step;
      step_batches.clear();
      int64_t chosen = 0;
      for (int64_t m = 0; m < accum; ++m) {
        step_batches.push_back(data.train->sample(B, seed, step, m));
        chosen += step_batches.back().num_mlm_targets();
      }
      mlm_scale = double(B * accum) / double(std::max<int64_t>(chosen, 1));
    }
    PairLosses r = pair_losses(model, step_batches[size_t(micro)]);
    return MicroBatchLoss{add(mul(r.mlm_sum, mlm_scale), r.nsp_sum), B, std::move(r.sums)};
  };
  recipe.train_metrics = pair_metrics;
  recipe.evaluate = [&](bool full) {
    return bert_eval(model, *data.val, seed, B, bert_eval_pair_count(config, full));
  };
  return run_training(config, model, *optimizer, recipe);
}

int eval_bert(const RunConfig& config, const std::string& checkpoint_file) {
  LoadedBert loaded = load_bert(checkpoint_file);
  BertData data = load_bert_data(config);
  NoGradGuard no_grad;
  Metrics m = bert_eval(*loaded.model, *data.val, uint64_t(config.seed), config.train.batch_size,
                        bert_settings(config).eval_pairs);
  print_eval(checkpoint_file, loaded.step, m);
  return 0;
}

}  // namespace forge
