// finetune, top to bottom: a GPT from model.init_from (full fine-tuning, or LoRA adapters on a
// frozen base), then one of three kinds of data, by what data.train names:
//   - a text file or token dataset: LM loss everywhere, exactly as gpt_pretrain;
//   - a directory of record files (the fortunes): records split by record into train and val,
//     each followed by finetune.end_of_text, LM loss over the concatenated stream;
//   - a .jsonl file of {"prompt", "completion"} records (SFT): loss on completion tokens only,
//     padded batches from a shuffling loader whose cursor (and data fingerprint) is checkpointed,
//     or with finetune.packing batches of full rows packed with records (data/packing.h);
//   - a .jsonl file of {"messages": [...]} conversations (its first record says which): each
//     rendered by the chat template (data.chat_template, else the tokenizer's), loss on the
//     assistant turns only, batched (or packed) as SFT records are.
// The trainer logs the initial model's validation loss at step 0, so the base's number stands next
// to the fine-tuned one in every run.
#include "recipes/finetune.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "core/ops.h"
#include "data/chat_sft.h"
#include "data/lm_data.h"
#include "data/packing.h"
#include "data/prepare.h"
#include "data/records.h"
#include "data/sft.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/lora_config.h"
#include "recipes/policy.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

enum class DataKind { stream, records, sft, chat };

// A shard directory is one token dataset (data/token_shards.h); any other directory holds record
// files. Chat records are told apart from prompt/completion ones by their first record, so that a
// data.val of the other kind is refused before either is read.
DataKind data_kind(const std::string& path) {
  if (is_shard_directory(path)) return DataKind::stream;
  if (fs::is_directory(path)) return DataKind::records;
  if (fs::path(path).extension() == ".jsonl")
    return is_chat_jsonl(path) ? DataKind::chat : DataKind::sft;
  return DataKind::stream;
}

// Prompt/completion and chat records both become SFT rows.
bool is_sft(DataKind kind) { return kind == DataKind::sft || kind == DataKind::chat; }

struct FinetuneData {
  std::unique_ptr<Tokenizer> tokenizer;
  DataKind kind = DataKind::stream;
  std::unique_ptr<LMWindows> train_windows, val_windows;  // stream and records
  std::shared_ptr<const SFTDataset> sft_train, sft_val;   // sft
};

using Rows = std::vector<std::vector<int32_t>>;

// The chosen rows, one after another, as one token stream.
std::shared_ptr<const std::vector<int32_t>> concatenate(const Rows& rows,
                                                        const std::vector<int64_t>& chosen) {
  auto out = std::make_shared<std::vector<int32_t>>();
  for (int64_t i : chosen) out->insert(out->end(), rows[size_t(i)].begin(), rows[size_t(i)].end());
  return out;
}

std::vector<int64_t> all_rows(const Rows& rows) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = int64_t(i);
  return out;
}

// Record files: every record's text and the end-of-text ids, split by record, then each side
// concatenated into one stream of windows. The split is stratified by file with the record
// loaders' rule, so the records a classify run holds out of a file are held out here too
// (docs/recipes/classify.md: the LM fine-tune of the ULMFiT pipeline never sees them).
std::pair<std::unique_ptr<LMWindows>, std::unique_ptr<LMWindows>> load_records(
    const RunConfig& config, const Tokenizer& tokenizer, const std::vector<int32_t>& eot) {
  const DataConfig& d = config.data;
  const RecordFormat format = finetune_settings(config).records;
  std::vector<std::string> labels;
  auto tokenize = [&](const std::string& path) {
    Rows rows;
    labels.clear();
    for (const TextRecord& r : read_labeled_records({path}, format)) {
      rows.push_back(tokenizer.encode(r.text));
      rows.back().insert(rows.back().end(), eot.begin(), eot.end());
      labels.push_back(r.label);
    }
    return rows;
  };
  const int64_t T = config.model.context;
  const Rows train = tokenize(d.train);
  if (!d.val.empty()) {
    const Rows val = tokenize(d.val);
    return {std::make_unique<LMWindows>(concatenate(train, all_rows(train)), T),
            std::make_unique<LMWindows>(concatenate(val, all_rows(val)), T)};
  }
  const auto [train_ids, val_ids] =
      split_rows_stratified(labels, d.val_fraction, uint64_t(d.split_seed));
  return {std::make_unique<LMWindows>(concatenate(train, train_ids), T),
          std::make_unique<LMWindows>(concatenate(train, val_ids), T)};
}

FinetuneData load_data(const RunConfig& config) {
  FinetuneData data;
  data.kind = data_kind(config.data.train);
  if (!config.data.val.empty() && data_kind(config.data.val) != data.kind)
    throw Error(ExitCode::usage, "data.val '" + config.data.val +
                                     "' is not the same kind of data as data.train '" +
                                     config.data.train + "'");
  if (data.kind == DataKind::stream) {
    LMSplits splits = load_lm_splits(config);
    data.tokenizer = std::move(splits.tokenizer);
    data.train_windows = std::move(splits.train);
    data.val_windows = std::move(splits.val);
    return data;
  }
  data.tokenizer = make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  const std::vector<int32_t> eot =
      end_of_text_ids(*data.tokenizer, finetune_settings(config).end_of_text);
  if (data.kind == DataKind::records) {
    std::tie(data.train_windows, data.val_windows) = load_records(config, *data.tokenizer, eot);
    return data;
  }
  const int64_t T = config.model.context + 1;  // inputs plus the last target
  std::function<SFTDataset(const std::string&)> tokenize = [&](const std::string& file) {
    return tokenize_sft(read_sft_jsonl(file), *data.tokenizer, eot, T);
  };
  std::optional<ChatTemplate> chat_template;
  if (data.kind == DataKind::chat) {
    chat_template = find_chat_template(config.data.chat_template,
                                       {config.data.tokenizer, config.model.init_from},
                                       "data.chat_template");
    tokenize = [&](const std::string& file) {
      return tokenize_chat(read_chat_jsonl(file), *chat_template, *data.tokenizer, T);
    };
  }
  SFTDataset train = tokenize(config.data.train);
  if (config.data.val.empty()) {
    SFTSplit split =
        split_sft_by_fraction(train, config.data.val_fraction, uint64_t(config.data.split_seed));
    data.sft_train = split.train;
    data.sft_val = split.val;
  } else {
    data.sft_train = std::make_shared<const SFTDataset>(std::move(train));
    data.sft_val = std::make_shared<const SFTDataset>(
        tokenize(config.data.val));
  }
  return data;
}

Metrics sft_eval(const nn::GPT& model, const SFTLoader& val, int64_t batch_size, int64_t batches,
                 bool full) {
  const int64_t rows = val.dataset().size();
  const int64_t count = full || batches == 0 ? rows : std::min(rows, batches * batch_size);
  double total = 0;
  int64_t targets = 0;
  for (int64_t first = 0; first < count && (first == 0 || !stop_requested()); first += batch_size) {
    MicroBatchLoss r = sft_loss(model, val.batch_at(first, std::min(batch_size, count - first)));
    total += r.loss_sum.item();
    targets += r.num_targets;
  }
  const double loss = total / double(std::max<int64_t>(targets, 1));
  return {{"loss", loss}, {"ppl", std::exp(loss)}, {"tokens", targets}};
}

// Training batches from an SFT loader, padded or packed, whose cursor is checkpointed.
template <class Loader>
void train_sft_from(Loader& loader, const nn::GPT& model, Recipe& recipe) {
  recipe.micro_batch = [&](int64_t, int64_t) { return sft_loss(model, loader.next()); };
  recipe.skip_micro_batch = [&](int64_t, int64_t) { loader.skip(); };
  recipe.data_state = [&] { return loader.cursor().to_counters("data."); };
  recipe.restore_data_state = [&](const DataState& state) {
    loader.restore(LoaderCursor::from_counters(state, "data.", loader.fingerprint()));
  };
}

}  // namespace

MicroBatchLoss sft_loss(const nn::GPT& model, const SFTBatch& batch) {
  Tensor logits = batch.segments.defined()
                      ? model.forward(batch.ids, nn::PackedRows{batch.positions, batch.segments})
                      : model.forward(batch.ids);
  const int64_t V = logits.size(-1);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  ce.ignore_index = LMWindows::kIgnoreTarget;
  return {.loss_sum = cross_entropy(reshape(logits, {-1, V}), reshape(batch.targets, {-1}), ce),
          .num_targets = batch.num_targets,
          .sums = {},
          .num_tokens = batch.num_tokens};
}

FinetuneSection finetune_settings(const RunConfig& config) {
  return {.end_of_text = config.get<std::string>("finetune.end_of_text"),
          .records = parse_record_format(config.get<std::string>("finetune.records")),
          .packing = config.get<bool>("finetune.packing")};
}

ConfigSection finetune_section() {
  return {"finetune",
          "how the finetune recipe reads record files and JSONL instruction records",
          {section_key("finetune.end_of_text", string_key("<|endoftext|>").aka({"eos", "eot"}),
                       "appended after every record and completion: a special token of the "
                       "tokenizer, else this text itself (e.g. \"\\n\" for bytes)"),
           section_key("finetune.records", choice_key("percent", {"percent", "lines", "file"}),
                       "how the files of a data.train directory split into records: '%' lines "
                       "(the fortunes format), lines, or whole files"),
           section_key("finetune.packing", boolean_key(false),
                       "JSONL instruction records packed first-fit into rows of model.context "
                       "(train.batch_size rows a batch), each attending only to itself with "
                       "positions from 0; false: one record a row, padded")}};
}

RecipeSpec finetune_recipe() {
  return {.name = "finetune",
          .doc = "a pretrained GPT fine-tuned on text, record files or JSONL instructions, "
                 "fully or with LoRA adapters",
          .families = {"gpt"},
          .sections = {"lora", "finetune"},
          .check =
              [](ConfigChecker& c) {
                check_policy(c, "a trained model");
                const RunConfig& config = c.config();
                c.cross({"finetune.packing", "data.train"},
                        !config.get<bool>("finetune.packing") ||
                            is_sft(data_kind(config.data.train)),
                        "finetune.packing packs JSONL instruction records, but data.train '" +
                            config.data.train + "' is not a .jsonl file");
              },
          .train = train_finetune,
          .eval = eval_finetune,
          .estimate = [](const RunConfig& c) { return estimate_policy_memory(c); },
          .data_directories = true};
}

int train_finetune(const RunConfig& config) {
  FinetuneData data = load_data(config);
  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  const Policy policy = build_policy(config, resuming);
  nn::GPT& model = *policy.model;
  std::unique_ptr<optim::Optimizer> optimizer =
      build_optimizer(config, policy_trained_parameters(config, policy), lora_lr_scale(config));

  const int64_t B = config.train.batch_size;
  const auto seed = uint64_t(config.seed);
  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step = B * config.model.context * config.train.grad_accum;
  std::unique_ptr<SFTLoader> train_loader, val_loader;
  std::unique_ptr<PackedSFTLoader> packed_loader;
  if (is_sft(data.kind)) {
    if (finetune_settings(config).packing) {
      packed_loader =
          std::make_unique<PackedSFTLoader>(data.sft_train, B, config.model.context, seed);
      train_sft_from(*packed_loader, model, recipe);
    } else {
      train_loader = std::make_unique<SFTLoader>(data.sft_train, B, seed);
      train_sft_from(*train_loader, model, recipe);
    }
    // Validation stays padded, one record a row: the same numbers with or without packing.
    val_loader = std::make_unique<SFTLoader>(data.sft_val, B, seed, /*shuffle=*/false);
    recipe.evaluate = [&](bool full) {
      return sft_eval(model, *val_loader, B, config.train.eval_batches, full);
    };
  } else {
    recipe.micro_batch = [&](int64_t step, int64_t micro) {
      return lm_loss(model, data.train_windows->sample(B, seed, step, micro));
    };
    recipe.evaluate = [&](bool full) {
      return lm_eval(model, *data.val_windows, B, config.train.eval_batches, full);
    };
  }
  recipe.sample = [&] {
    std::string prompt = "\n";
    if (is_sft(data.kind) && data.sft_val->size() > 0)
      prompt = data.tokenizer->decode(
          {data.sft_val->tokens[0].begin(),
           data.sft_val->tokens[0].begin() + data.sft_val->prompt_len[0]});
    return sample_text(model, *data.tokenizer, prompt, config);
  };
  return run_training(config, policy_run_models(policy), *optimizer, recipe);
}

int eval_finetune(const RunConfig& config, const fs::path& checkpoint_file, const CommandOptions&) {
  LoadedGPT loaded = load_gpt(checkpoint_file);
  FinetuneData data = load_data(config);
  NoGradGuard no_grad;
  Metrics m;
  const int64_t B = config.train.batch_size;
  if (is_sft(data.kind))
    m = sft_eval(*loaded.model, SFTLoader(data.sft_val, B, uint64_t(config.seed), false), B, 0,
                 true);
  else
    m = lm_eval(*loaded.model, *data.val_windows, B, 0, true);
  print_eval(checkpoint_file.string(), loaded.step, m);
  return 0;
}

}  // namespace forge
