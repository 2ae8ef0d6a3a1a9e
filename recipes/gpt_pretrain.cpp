// gpt_pretrain, top to bottom: data (bytes, split by position), model, optimizer, then the two
// functions that make it a language-model objective: summed next-token cross-entropy per
// micro-batch, and validation loss over evenly spread (periodic) or all (final) windows.
#include "recipes/gpt_pretrain.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/ops.h"
#include "data/lm_data.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "recipes/checkpoint.h"
#include "recipes/components.h"
#include "recipes/trainer.h"

namespace forge {
namespace {

struct LMSplits {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LMWindows> train, val;
};

// Token ids of a text file (tokenized now) or of a prepared dataset (validated against the
// tokenizer and the model's vocabulary).
std::shared_ptr<const std::vector<int32_t>> load_tokens(const std::string& path,
                                                        const Tokenizer& tokenizer,
                                                        const TokenizerInfo& info,
                                                        int64_t vocab_size,
                                                        std::optional<TokenDataset>* dataset) {
  if (std::filesystem::path(path).extension() == ".h5") {
    TokenDataset ds = open_token_dataset(path, &info, vocab_size);
    auto tokens = ds.tokens();
    if (dataset) dataset->emplace(std::move(ds));
    return tokens;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ExitCode::data, path + ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = tokenizer.encode(text.str());
  return std::make_shared<const std::vector<int32_t>>(std::move(ids));
}

LMSplits load_data(const RunConfig& config) {
  const DataConfig& d = config.data;
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(d.tokenizer, d.special_tokens);
  const TokenizerInfo info{tokenizer->name(), tokenizer->vocab_size(), vocabulary_hash(*tokenizer)};
  const int64_t V = config.model.vocab_size;
  std::optional<TokenDataset> dataset;
  auto train = load_tokens(d.train, *tokenizer, info, V, &dataset);
  TokenSplit split;
  if (!d.val.empty())
    split = {train, load_tokens(d.val, *tokenizer, info, V, nullptr)};
  else if (dataset)
    split = dataset->split_by_document(d.val_fraction);  // documents are never cut
  else
    split = split_by_position(std::vector<int32_t>(*train), d.val_fraction);
  int64_t T = config.model.context;
  return {std::move(tokenizer), std::make_unique<LMWindows>(split.train, T),
          std::make_unique<LMWindows>(split.val, T)};
}

// Summed cross-entropy of a batch and its number of scored targets.
MicroBatchLoss lm_loss(const nn::GPT& model, const LMBatch& batch) {
  Tensor logits = model.forward(batch.ids);
  int64_t V = logits.size(-1);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  ce.ignore_index = LMWindows::kIgnoreTarget;
  Tensor flat_targets = reshape(batch.targets, {-1});
  Tensor loss = cross_entropy(reshape(logits, {-1, V}), flat_targets, ce);
  int64_t scored = 0;
  const int64_t* t = flat_targets.contiguous().data<int64_t>();
  for (int64_t i = 0; i < flat_targets.numel(); ++i) scored += t[i] != LMWindows::kIgnoreTarget;
  return {loss, scored};
}

Metrics lm_eval(const nn::GPT& model, const LMWindows& val, int64_t batch_size, int64_t batches,
                bool full) {
  int64_t windows = val.num_eval_windows();
  double total = 0;
  int64_t targets = 0;
  auto run = [&](int64_t first) {
    MicroBatchLoss r = lm_loss(model, val.eval_batch(first, batch_size));
    total += r.loss_sum.item();
    targets += r.num_targets;
  };
  if (full || batches == 0 || batches * batch_size >= windows) {
    for (int64_t first = 0; first < windows; first += batch_size) run(first);
  } else {
    // Evenly spread blocks, so a partial evaluation samples the whole split, not its beginning.
    for (int64_t j = 0; j < batches; ++j)
      run(batches == 1 ? 0 : j * (windows - batch_size) / (batches - 1));
  }
  double loss = total / double(targets);
  return {{"loss", loss}, {"ppl", std::exp(loss)}, {"tokens", targets}};
}

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
          .eval = [](const RunConfig& config, const std::filesystem::path& checkpoint) {
            return eval_gpt(config, checkpoint.string());
          },
          .estimate = estimate_gpt};
}

int train_gpt(const RunConfig& config) {
  LMSplits data = load_data(config);
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
  recipe.sample = [&] {
    nn::SamplingOptions options;
    options.max_new_tokens = config.train.sample_tokens;
    options.temperature = 0.8;
    options.top_k = 200;
    options.seed = uint64_t(config.seed);
    model.eval();
    std::vector<int32_t> prompt = data.tokenizer->encode("\n");
    std::vector<int64_t> ids = nn::generate(model, {prompt.begin(), prompt.end()}, options);
    std::string text = data.tokenizer->decode({ids.begin(), ids.end()});
    model.train();
    return "--- sample (" + std::to_string(options.max_new_tokens) + " tokens) ---\n" + text;
  };
  return run_training(config, model, *optimizer, recipe);
}

int eval_gpt(const RunConfig& config, const std::string& checkpoint_file) {
  LoadedGPT loaded = load_gpt(checkpoint_file);
  LMSplits data = load_data(config);
  NoGradGuard no_grad;
  Metrics m = lm_eval(*loaded.model, *data.val, config.train.batch_size, 0, true);
  print_eval(checkpoint_file, loaded.step, m);
  return 0;
}

}  // namespace forge
