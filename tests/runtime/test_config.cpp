// Config loading against the schema: values and defaults, every error kind with its exact line
// (file:line:col and message), did-you-mean, overrides, derived defaults, cross-field checks, the
// recipe registry and its sections, checkpoint keys and model.init_from, the resolved-config round
// trip, docs/config.md staying in step with the schema, and the bert: section's struct.
// Tests run from the repository root, so fixture paths are repo-relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "optim/optimizer.h"
#include "recipes/bert_pretrain.h"
#include "runtime/bert_config.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "tests/recipes/section_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

constexpr const char* kTiny = "tests/recipes/configs/tiny.txt";

// The smallest valid config, for tests that add one thing to it.
std::string minimal(const std::string& extra = "") {
  return "recipe: gpt_pretrain\ndata:\n  train: " + std::string(kTiny) + "\n" + extra;
}

// Every line load_config_string reports for `text` (named x.yaml), checking the exit code is 2.
std::string errors_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    load_config_string(text, "x.yaml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    return e.what();
  }
  ADD_FAILURE() << "expected a config error for:\n" << text;
  return "";
}

std::string line(const std::string& where, const std::string& message) {
  return "forge: config error: " + where + ": " + message;
}

TEST(ConfigSchema, EveryKeyHasAOneLineDoc) {
  ASSERT_GT(config_schema().size(), 50u);
  for (const ConfigKey& key : config_schema()) {
    EXPECT_FALSE(key.doc.empty()) << key.path;
    EXPECT_EQ(key.doc.find('\n'), std::string::npos) << key.path;
  }
}

TEST(ConfigSchema, DefaultsLiveInTheSchema) {
  RunConfig c = default_config();
  for (const ConfigKey& key : config_schema())
    EXPECT_EQ(key.get(c), key.default_value) << key.path;
  EXPECT_EQ(c.seed, 1337);
  EXPECT_EQ(c.model.norm, "layernorm");
  EXPECT_EQ(c.model.ffn_mult, 4.0);
  EXPECT_EQ(c.optimizer.betas, (std::array<double, 2>{0.9, 0.999}));
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.train.keep_last, 3);
  EXPECT_EQ(c.train.resume, "auto");
  std::set<std::string> required;
  for (const ConfigKey& key : config_schema())
    if (key.required) required.insert(key.path);
  EXPECT_EQ(required, (std::set<std::string>{"recipe", "data.train"}));
}

TEST(ConfigLoad, ValidFileLoadsItsValuesAndTheDefaults) {
  RunConfig c = load_config("tests/recipes/configs/gpt_tiny.yaml");
  EXPECT_EQ(c.recipe, "gpt_pretrain");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.output_dir, "runs/gpt_tiny");  // derived from the file name
  EXPECT_EQ(c.model.d_model, 96);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.dropout, 0.1);
  EXPECT_EQ(c.data.train, kTiny);
  EXPECT_EQ(c.data.val_fraction, 0.2);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.betas, (std::array<double, 2>{0.9, 0.99}));
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.schedule.name, "warmup_cosine");
  EXPECT_EQ(c.schedule.min_lr, 1e-4);
  EXPECT_EQ(c.schedule.noam_d_model, 96);  // derived from model.d_model
  EXPECT_EQ(c.train.grad_accum, 2);
  EXPECT_EQ(c.train.eval_every, 250);
  // Not in the file: schema defaults.
  EXPECT_EQ(c.model.norm, "layernorm");
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.model.norm_eps, 1e-5);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_TRUE(c.optimizer.freeze.empty());
  EXPECT_EQ(c.train.keep_last, 3);
  EXPECT_EQ(c.train.nan_policy, "abort");
}

TEST(ConfigLoad, MinimalConfigIsTheDefaultsPlusDerivedKeys) {
  RunConfig c = load_config_string(minimal(), "configs/small.yaml");
  RunConfig want = default_config();
  want.recipe = "gpt_pretrain";
  want.data.train = kTiny;
  want.output_dir = "runs/small";
  want.schedule.noam_d_model = want.model.d_model;
  want.model.norm_placement = "pre";
  want.data.split_seed = want.seed;
  EXPECT_EQ(c, want);
}

TEST(ConfigLoad, TheSplitSeedIsTheSeedUnlessGiven) {
  EXPECT_EQ(load_config_string(minimal("seed: 7\n"), "x.yaml").data.split_seed, 7);
  const RunConfig fixed = load_config_string(minimal("seed: 7\n"), "x.yaml", {"data.split_seed=3"});
  EXPECT_EQ(fixed.data.split_seed, 3);
  EXPECT_EQ(fixed.seed, 7);
  // The resolved config names it, so a run stored with it reloads the same.
  EXPECT_NE(to_yaml(fixed).find("  split_seed: 3\n"), std::string::npos);
}

// What forge train compares its output_dir with: every path and checkpoint key that is set.
TEST(ConfigLoad, InputPathsAreEveryPathAndCheckpointKeySet) {
  const RunConfig c = load_config_string(
      minimal(), "x.yaml", {"recipe=finetune", "data.val=val.txt", "model.init_from=runs/base"},
      ConfigFiles::skip);
  std::vector<std::string> paths = config_input_paths(c);
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(paths, (std::vector<std::string>{"runs/base", kTiny, "val.txt"}));
}

TEST(ConfigLoad, BlockAndFlowStyleAgree) {
  std::string block = minimal(
      "optimizer:\n  lr: 3.0e-4\n  betas:\n    - 0.8\n    - 0.95\n  freeze:\n    - \"*.bias\"\n");
  std::string flow = minimal("optimizer: {lr: 3e-4, betas: [0.8, 0.95], freeze: ['*.bias']}\n");
  RunConfig a = load_config_string(block, "x.yaml");
  EXPECT_EQ(a, load_config_string(flow, "x.yaml"));
  EXPECT_EQ(a.optimizer.lr, 3e-4);
  EXPECT_EQ(a.optimizer.betas, (std::array<double, 2>{0.8, 0.95}));
  EXPECT_EQ(a.optimizer.freeze, std::vector<std::string>{"*.bias"});
}

TEST(ConfigLoad, ExplicitOutputDirAndNoamDModelAreKept) {
  RunConfig c = load_config_string(
      minimal("output_dir: runs/mine\n"
              "schedule: {name: noam, warmup_steps: 10, noam_d_model: 512}\n"),
      "x.yaml");
  EXPECT_EQ(c.output_dir, "runs/mine");
  EXPECT_EQ(c.schedule.noam_d_model, 512);
}

// ---- errors ---------------------------------------------------------------------------------

TEST(ConfigErrors, UnknownKeySuggestsTheSiblingItIsCloseTo) {
  // docs/config.md's example, at the same line and column.
  std::string text = minimal(
      "model:\n  d_model: 64\noptimizer:\n  lerning_rate: 3e-4\n");
  EXPECT_EQ(errors_of(text),
            line("x.yaml:7:3", "unknown key 'optimizer.lerning_rate' (did you mean 'lr'?)"));
  EXPECT_EQ(errors_of(minimal("model: {n_head: 4}\n")),
            line("x.yaml:4:9", "unknown key 'model.n_head' (did you mean 'n_heads'?)"));
  EXPECT_EQ(errors_of(minimal("train: {max_setps: 4}\n")),  // transposition
            line("x.yaml:4:9", "unknown key 'train.max_setps' (did you mean 'max_steps'?)"));
  EXPECT_EQ(errors_of(minimal("optimiser: {lr: 1.0}\n")),
            line("x.yaml:4:1", "unknown key 'optimiser' (did you mean 'optimizer'?)"));
}

TEST(ConfigErrors, UnknownKeySuggestsOtherSectionsAndCommonNames) {
  EXPECT_EQ(errors_of(minimal("train: {lr: 0.1}\n")),
            line("x.yaml:4:9", "unknown key 'train.lr' (did you mean 'optimizer.lr'?)"));
  EXPECT_EQ(errors_of(minimal("lr: 0.1\n")),
            line("x.yaml:4:1", "unknown key 'lr' (did you mean 'optimizer.lr'?)"));
  EXPECT_EQ(errors_of(minimal("model: {n_embd: 64, block_size: 32}\n")),
            line("x.yaml:4:9", "unknown key 'model.n_embd' (did you mean 'd_model'?)") + "\n" +
                line("x.yaml:4:21", "unknown key 'model.block_size' (did you mean 'context'?)"));
  EXPECT_EQ(errors_of(minimal("train: {grad_clip: 1.0}\n")),
            line("x.yaml:4:9", "unknown key 'train.grad_clip' (did you mean 'clip_grad_norm'?)"));
  EXPECT_EQ(errors_of(minimal("model: {zebra: 1}\n")),
            line("x.yaml:4:9", "unknown key 'model.zebra'"));
}

TEST(ConfigErrors, WrongTypesQuoteTheValue) {
  EXPECT_EQ(errors_of(minimal("optimizer: {lr: fast}\n")),
            line("x.yaml:4:17", "optimizer.lr: expected a number, got 'fast'"));
  EXPECT_EQ(errors_of(minimal("model: {n_layers: 4.5}\n")),
            line("x.yaml:4:19", "model.n_layers: expected an integer, got '4.5'"));
  EXPECT_EQ(errors_of(minimal("model: {bias: yes}\n")),
            line("x.yaml:4:15", "model.bias: expected true or false, got 'yes'"));
  EXPECT_EQ(errors_of(minimal("optimizer: {lr: \"3e-4\"}\n")),
            line("x.yaml:4:17", "optimizer.lr: expected a number, got the quoted string '3e-4'"));
  EXPECT_EQ(errors_of(minimal("model: {norm: [a, b]}\n")),
            line("x.yaml:4:15", "model.norm: expected a string, got a list"));
  EXPECT_EQ(errors_of(minimal("optimizer: {betas: 0.9}\n")),
            line("x.yaml:4:20", "optimizer.betas: expected a list of 2 numbers, got '0.9'"));
  EXPECT_EQ(errors_of(minimal("optimizer: {betas: [0.9, 0.99, 0.999]}\n")),
            line("x.yaml:4:20", "optimizer.betas: expected a list of 2 numbers, got 3"));
  EXPECT_EQ(errors_of(minimal("optimizer: {betas: [0.9, x]}\n")),
            line("x.yaml:4:26", "optimizer.betas[1]: expected a number, got 'x'"));
  EXPECT_EQ(errors_of(minimal("optimizer: {freeze: blocks.0.*}\n")),
            line("x.yaml:4:21", "optimizer.freeze: expected a list of strings, got 'blocks.0.*'"));
  EXPECT_EQ(errors_of(minimal("seed:\n")),
            line("x.yaml:4:1", "seed: expected an integer, got nothing"));
  EXPECT_EQ(errors_of(minimal("optimizer: {lr: .inf}\n")),
            line("x.yaml:4:17", "optimizer.lr: expected a number, got '.inf'"));
}

TEST(ConfigErrors, OutOfRangeNamesTheRange) {
  EXPECT_EQ(errors_of(minimal("model: {dropout: 1.5}\n")),
            line("x.yaml:4:18", "model.dropout: must be in [0, 1), got 1.5"));
  EXPECT_EQ(errors_of(minimal("seed: -1\n")), line("x.yaml:4:7", "seed: must be >= 0, got -1"));
  EXPECT_EQ(errors_of(minimal("optimizer: {lr: 0}\n")),
            line("x.yaml:4:17", "optimizer.lr: must be > 0, got 0"));
  EXPECT_EQ(errors_of(minimal("optimizer: {betas: [0.9, 1.0]}\n")),
            line("x.yaml:4:26", "optimizer.betas[1]: must be in [0, 1), got 1.0"));
  EXPECT_EQ(errors_of(minimal("optimizer: {layer_lr_decay: 0.8}\n")),
            line("x.yaml:4:29", "optimizer.layer_lr_decay: must be >= 1, got 0.8"));
  EXPECT_EQ(errors_of(minimal("train: {batch_size: 0}\n")),
            line("x.yaml:4:21", "train.batch_size: must be in [1, 65536], got 0"));
  EXPECT_EQ(errors_of(minimal("seed: 99999999999999999999\n")),
            line("x.yaml:4:7", "seed: expected an integer, got '99999999999999999999'"));
}

TEST(ConfigErrors, BadChoiceListsTheChoices) {
  EXPECT_EQ(errors_of(minimal("model: {norm: batchnorm}\n")),
            line("x.yaml:4:15", "model.norm: must be one of layernorm, rmsnorm; got 'batchnorm'"));
  EXPECT_EQ(errors_of(minimal("model: {norm: rms_norm}\n")),
            line("x.yaml:4:15", "model.norm: must be one of layernorm, rmsnorm; got 'rms_norm' "
                                "(did you mean 'rmsnorm'?)"));
  EXPECT_EQ(errors_of("recipe: gpt_pretrian\ndata: {train: " + std::string(kTiny) + "}\n"),
            line("x.yaml:1:9", "recipe: must be one of gpt_pretrain, bert_pretrain, finetune, distill, classify, "
                               "reward_model, dpo, ppo, grpo; got 'gpt_pretrian' (did you mean 'gpt_pretrain'?)"));
}

TEST(ConfigErrors, MissingRequiredKeyPointsAtItsSection) {
  EXPECT_EQ(errors_of("recipe: gpt_pretrain\nseed: 1\ndata:\n  val_fraction: 0.2\n"),
            line("x.yaml:3:1", "missing required key 'data.train'"));
  EXPECT_EQ(errors_of("data: {train: " + std::string(kTiny) + "}\n"),
            line("x.yaml", "missing required key 'recipe'"));
  EXPECT_EQ(errors_of(""), line("x.yaml", "missing required key 'recipe'") + "\n" +
                               line("x.yaml", "missing required key 'data.train'"));
  EXPECT_EQ(errors_of("recipe: gpt_pretrain\ndata: {train: \"\"}\n"),
            line("x.yaml:2:15", "data.train: must not be empty"));
}

TEST(ConfigErrors, YamlSyntaxErrorIsReportedAloneWithItsPosition) {
  EXPECT_EQ(errors_of("recipe: gpt_pretrain\nmodel:\n  d_model: [1,\n"),
            line("x.yaml:4:1", "YAML syntax error: end of sequence flow not found"));
  EXPECT_EQ(errors_of("recipe: gpt_pretrain\nmodel: {d_model: 4\nseed: 1\n"),
            line("x.yaml:3:5", "YAML syntax error: end of map flow not found"));
  EXPECT_EQ(errors_of("- recipe\n"),
            line("x.yaml:1:1", "expected a mapping of config keys at the top level, got a list"));
}

TEST(ConfigErrors, StructureMistakes) {
  EXPECT_EQ(errors_of(minimal("optimizer: adamw\n")),
            line("x.yaml:4:12",
                 "'optimizer' is a section: expected a mapping of its keys, got 'adamw'"));
  EXPECT_EQ(errors_of(minimal("seed: 1\nseed: 2\n")),
            line("x.yaml:5:1", "duplicate key 'seed' (first given at line 4)"));
  EXPECT_EQ(errors_of(minimal("model: {d_model: 64, d_model: 32}\n")),
            line("x.yaml:4:22", "duplicate key 'model.d_model' (first given at line 4)"));
  EXPECT_NO_THROW(load_config_string(minimal("model:\n"), "x.yaml"));  // empty section
}

TEST(ConfigErrors, MissingDataFilesResolveAgainstTheWorkingDirectory) {
  EXPECT_EQ(errors_of("recipe: gpt_pretrain\ndata:\n  train: data/nope.txt\n"
                      "  val: tests/recipes\n"),
            line("x.yaml:3:10", "data.train: file not found: 'data/nope.txt'") + "\n" +
                line("x.yaml:4:8", "data.val: 'tests/recipes' is a directory, expected a file"));
  EXPECT_NO_THROW(load_config_string("recipe: gpt_pretrain\ndata: {train: " + std::string(kTiny) +
                                         ", val: " + kTiny + "}\n",
                                     "x.yaml"));
  // A config read back from a checkpoint need not find its data.
  EXPECT_NO_THROW(load_config_string("recipe: gpt_pretrain\ndata: {train: data/nope.txt}\n",
                                     "ckpt", {}, ConfigFiles::skip));
}

TEST(ConfigErrors, MissingConfigFileIsOneLine) {
  try {
    load_config("tests/recipes/configs/nope.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    EXPECT_EQ(std::string(e.what()),
              line("tests/recipes/configs/nope.yaml", "file not found"));
  }
  EXPECT_EQ(static_cast<int>(ExitCode::usage), 2);
}

TEST(ConfigErrors, SizesHaveUpperBoundsNamedInOneRun) {
  EXPECT_EQ(errors_of(minimal("model: {vocab_size: 100000000, n_layers: 1000000}\n"
                              "train: {batch_size: 1000000000000000000}\n")),
            line("x.yaml:4:21", "model.vocab_size: must be in [1, 16777216], got 100000000") +
                "\n" + line("x.yaml:4:42", "model.n_layers: must be in [1, 1024], got 1000000") +
                "\n" + line("x.yaml:5:21", "train.batch_size: must be in [1, 65536], got 1000000000000000000"));
  EXPECT_EQ(errors_of(minimal(), {"model.d_model=1000000"}),
            line("override 'model.d_model=1000000'",
                 "model.d_model: must be in [1, 65536], got 1000000"));
}

TEST(ConfigErrors, AllMistakesOfAFileAreReportedTogether) {
  try {
    load_config("tests/recipes/configs/three_errors.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    const std::string f = "tests/recipes/configs/three_errors.yaml";
    EXPECT_EQ(std::string(e.what()),
              line(f + ":5:3", "unknown key 'model.n_head' (did you mean 'n_heads'?)") + "\n" +
                  line(f + ":6:12", "model.dropout: must be in [0, 1), got 1.5") + "\n" +
                  line(f + ":10:7", "optimizer.lr: expected a number, got 'fast'"));
  }
}

TEST(ConfigErrors, ErrorsComeInFileOrderThenOverrides) {
  std::string text = "model: {dropout: 2.0}\nseed: x\n";  // recipe and data.train missing too
  EXPECT_EQ(errors_of(text, {"optimizer.lr=-1"}),
            line("x.yaml:1:18", "model.dropout: must be in [0, 1), got 2.0") + "\n" +
                line("x.yaml:2:7", "seed: expected an integer, got 'x'") + "\n" +
                line("override 'optimizer.lr=-1'", "optimizer.lr: must be > 0, got -1") + "\n" +
                line("x.yaml", "missing required key 'recipe'") + "\n" +
                line("x.yaml", "missing required key 'data.train'"));
  // Checks that run after the walk (files, rules across keys) still sort by position.
  EXPECT_EQ(errors_of("data: {train: nope.txt}\nmodel: {d_model: 10, n_heads: 3, zebra: 1}\n"),
            line("x.yaml:1:15", "data.train: file not found: 'nope.txt'") + "\n" +
                line("x.yaml:2:31", "model.d_model (10) must be divisible by model.n_heads (3)") +
                "\n" + line("x.yaml:2:34", "unknown key 'model.zebra'") + "\n" +
                line("x.yaml", "missing required key 'recipe'"));
}

// ---- overrides ------------------------------------------------------------------------------

TEST(ConfigOverrides, SetNumbersListsBoolsStringsAndNestedKeys) {
  RunConfig c = load_config_string(
      minimal("optimizer: {lr: 1.0e-3}\n"), "x.yaml",
      {"optimizer.lr=3e-4", "optimizer.betas=[0.9,0.95]", "model.bias=false",
       "model.norm=rmsnorm", "train.max_steps=50", "output_dir=runs/a b",
       "optimizer.freeze=[\"*.bias\", blocks.0.*]", "train.max_steps=60"});
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas, (std::array<double, 2>{0.9, 0.95}));
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.model.norm, "rmsnorm");
  EXPECT_EQ(c.train.max_steps, 60);  // the last override wins
  EXPECT_EQ(c.output_dir, "runs/a b");
  EXPECT_EQ(c.optimizer.freeze, (std::vector<std::string>{"*.bias", "blocks.0.*"}));
  // An override can supply a required key and changes what derived keys follow.
  RunConfig d = load_config_string("recipe: gpt_pretrain\n", "x.yaml",
                                   {std::string("data.train=") + kTiny, "model.d_model=256"});
  EXPECT_EQ(d.data.train, kTiny);
  EXPECT_EQ(d.schedule.noam_d_model, 256);
}

TEST(ConfigOverrides, ErrorsNameTheOverride) {
  EXPECT_EQ(errors_of(minimal(), {"optimizer.lr=abc"}),
            line("override 'optimizer.lr=abc'", "optimizer.lr: expected a number, got 'abc'"));
  EXPECT_EQ(errors_of(minimal(), {"optimizer.lerning_rate=1"}),
            line("override 'optimizer.lerning_rate=1'",
                 "unknown key 'optimizer.lerning_rate' (did you mean 'optimizer.lr'?)"));
  EXPECT_EQ(errors_of(minimal(), {"optimiser.lr=1"}),
            line("override 'optimiser.lr=1'",
                 "unknown key 'optimiser.lr' (did you mean 'optimizer.lr'?)"));
  EXPECT_EQ(errors_of(minimal(), {"optimizer.betas=[0.9,1.5]"}),
            line("override 'optimizer.betas=[0.9,1.5]'",
                 "optimizer.betas[1]: must be in [0, 1), got 1.5"));
  EXPECT_EQ(errors_of(minimal(), {"train.max_steps"}),
            line("override 'train.max_steps'", "expected key.path=value"));
  EXPECT_EQ(errors_of(minimal(), {"model=3"}),
            line("override 'model=3'",
                 "'model' is a section, not a key; set one of its keys, e.g. model.arch=..."));
  EXPECT_EQ(errors_of(minimal(), {"optimizer.betas=[0.9,"}),
            line("override 'optimizer.betas=[0.9,'",
                 "optimizer.betas: value is not valid YAML: end of sequence flow not found"));
  EXPECT_EQ(errors_of(minimal(), {"data.train=data/nope.txt"}),
            line("override 'data.train=data/nope.txt'",
                 "data.train: file not found: 'data/nope.txt'"));
  EXPECT_EQ(errors_of(minimal(), {"seed="}),
            line("override 'seed='", "seed: expected an integer, got nothing"));
}

// ---- checks across keys -----------------------------------------------------------------------

TEST(ConfigCrossField, EachRuleNamesTheKeyWhereItWasSet) {
  EXPECT_EQ(errors_of(minimal("model: {d_model: 100, n_heads: 3}\n")),
            line("x.yaml:4:32", "model.d_model (100) must be divisible by model.n_heads (3)"));
  EXPECT_EQ(errors_of(minimal("model: {d_model: 96, n_heads: 32, position: rotary}\n")),
            line("x.yaml:4:45", "model.position 'rotary' needs an even head dimension, got "
                                "model.d_model / model.n_heads = 3"));
  EXPECT_EQ(errors_of(minimal("model: {vocab_size: 100}\n")),
            line("x.yaml:4:21", "model.vocab_size (100) must be >= 256, the vocabulary of "
                                "tokenizer 'bytes' with 0 special tokens"));
  EXPECT_EQ(errors_of(minimal("schedule: {warmup_steps: 2000}\n")),
            line("x.yaml:4:26", "schedule.warmup_steps (2000) must be <= train.max_steps (1000)"));
  EXPECT_EQ(errors_of(minimal("schedule: {name: noam}\n")),
            line("x.yaml:4:18", "schedule.warmup_steps must be >= 1 for schedule 'noam'"));
  EXPECT_EQ(errors_of(minimal("schedule: {min_lr: 0.01}\n")),
            line("x.yaml:4:20", "schedule.min_lr (0.01) must be <= optimizer.lr (0.001)"));
  EXPECT_EQ(errors_of(minimal("optimizer: {nesterov: true}\n")),
            line("x.yaml:4:23",
                 "optimizer.nesterov needs optimizer.name 'sgd' and optimizer.momentum > 0"));
  EXPECT_NO_THROW(load_config_string(
      minimal("optimizer: {name: sgd, momentum: 0.9, nesterov: true}\n"), "x.yaml"));
  EXPECT_EQ(errors_of(minimal("train: {eval_every: 10}\n"), {"data.val_fraction=0"}),
            line("x.yaml:4:21", "train.eval_every (10) needs a validation split: set data.val or "
                                "data.val_fraction > 0"));
  // Overridden keys are blamed on the override.
  EXPECT_EQ(errors_of(minimal(), {"model.n_heads=5"}),
            line("override 'model.n_heads=5'",
                 "model.d_model (128) must be divisible by model.n_heads (5)"));
}

TEST(ConfigCrossField, TheRecipeFixesTheModelFamily) {
  const std::string bert = "recipe: bert_pretrain\ndata:\n  train: " + std::string(kTiny) +
                           "\n  special_tokens: ['[PAD]', '[CLS]', '[SEP]', '[MASK]']\n";
  EXPECT_EQ(errors_of(bert, {"model.vocab_size=260"}),
            line("x.yaml:1:9", "recipe bert_pretrain trains model.arch 'bert', the config says "
                               "'gpt'"));
  RunConfig c = load_config_string(bert + "model: {arch: bert, vocab_size: 260}\n", "x.yaml");
  EXPECT_EQ(c.model.norm_placement, "post");
  EXPECT_EQ(errors_of(bert + "model: {arch: bert, vocab_size: 259}\n"),
            line("x.yaml:5:33", "model.vocab_size (259) must be >= 260, the vocabulary of "
                                "tokenizer 'bytes' with 4 special tokens"));
  EXPECT_EQ(errors_of(bert + "model: {arch: bert, vocab_size: 260, position: rotary}\n"),
            line("x.yaml:5:48", "model.position: model.arch 'bert' needs learned positions"));
  EXPECT_EQ(errors_of(minimal("model: {norm_placement: post}\n")),
            line("x.yaml:4:25", "model.norm_placement: gpt blocks are pre-norm, got 'post'"));
  EXPECT_EQ(errors_of("recipe: bert_pretrain\nmodel: {arch: bert, vocab_size: 260}\ndata:\n  train: " +
                      std::string(kTiny) + "\n  special_tokens: ['[CLS]', '[SEP]']\n"),
            line("x.yaml:5:19", "data.special_tokens: recipe bert_pretrain needs [PAD], [CLS], "
                                "[SEP] and [MASK]; missing [PAD], [MASK]"));
}

TEST(ConfigCrossField, TokenizerIsANameOrATrainedDirectory) {
  EXPECT_EQ(errors_of(minimal("  tokenizer: nope/dir\n")),
            line("x.yaml:4:14", "data.tokenizer: 'nope/dir' is not bytes, gpt2, a tokenizer.json "
                                "or SentencePiece .model file or a directory with tokenizer.json, "
                                "tokenizer.model, vocab.txt, encoder.json + vocab.bpe or "
                                "vocab.json + merges.txt"));
  // gpt2's own <|endoftext|> is not counted twice.
  RunConfig c = load_config_string(
      minimal("  tokenizer: gpt2\n  special_tokens: ['<|endoftext|>', '[MASK]']\n"
              "model: {vocab_size: 50258}\n"),
      "x.yaml");
  EXPECT_EQ(c.data.tokenizer, "gpt2");
  EXPECT_NE(errors_of(minimal("  tokenizer: gpt2\nmodel: {vocab_size: 50256}\n")), "");
  // A directory is loaded: an empty one is reported with the file it lacks.
  testing::TempDir dir;
  std::string error = errors_of(minimal("  tokenizer: " + dir.path().string() + "\n"));
  EXPECT_NE(error.find("data.tokenizer: "), std::string::npos) << error;
  EXPECT_NE(error.find("encoder.json"), std::string::npos) << error;
  // A SentencePiece model file is a tokenizer too, and its 1000 pieces bound model.vocab_size.
  const std::string spm = std::string(FORGE_SOURCE_DIR) + "/tests/golden/sentencepiece/bpe.model";
  EXPECT_EQ(load_config_string(minimal("  tokenizer: " + spm + "\nmodel: {vocab_size: 1000}\n"),
                               "x.yaml")
                .data.tokenizer,
            spm);
  error = errors_of(minimal("  tokenizer: " + spm + "\nmodel: {vocab_size: 999}\n"));
  EXPECT_NE(error.find("must be >= 1000"), std::string::npos) << error;
  // So is a tokenizer.json named as a file.
  const std::string json =
      std::string(FORGE_SOURCE_DIR) + "/tests/golden/tokenizers/sp_bpe/tokenizer.json";
  error = errors_of(minimal("  tokenizer: " + json + "\nmodel: {vocab_size: 999}\n"));
  EXPECT_NE(error.find("must be >= 1565"), std::string::npos) << error;
}

TEST(ConfigCrossField, SkippedWhenAKeyItReadsWasRejected) {
  // The bad n_heads is one error; no divisibility error piles on top of it.
  EXPECT_EQ(errors_of(minimal("model: {d_model: 100, n_heads: three}\n")),
            line("x.yaml:4:32", "model.n_heads: expected an integer, got 'three'"));
}

// ---- the resolved config ----------------------------------------------------------------------

TEST(ConfigRoundTrip, ResolvedYamlLoadsBackToTheSameConfig) {
  RunConfig c = load_config(
      "tests/recipes/configs/gpt_tiny.yaml",
      {"optimizer.freeze=[\"*.bias\", 'ln_f.weight', \"true\", \"12\", \"a: b\", \"x\\\"y\"]",
       "output_dir=runs/with space#hash", "optimizer.lr=3.0000000000000004e-4",
       "model.dropout=0.1", "schedule.min_lr=1.0e-7", "seed=0"});
  std::string yaml = to_yaml(c);
  RunConfig back = load_config_string(yaml, "runs/gpt_tiny/config.yaml");
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(back.optimizer.freeze[4], "a: b");
  EXPECT_EQ(back.optimizer.lr, 3.0000000000000004e-4);
}

TEST(ConfigRoundTrip, EveryKeyIsPrintedInSchemaOrderUnderItsSection) {
  std::string yaml = to_yaml(load_config_string(minimal(), "x.yaml"));
  std::istringstream in(yaml);
  std::vector<std::string> printed;
  std::string section, text;
  while (std::getline(in, text)) {
    bool nested = text.rfind("  ", 0) == 0;
    std::string name = text.substr(nested ? 2 : 0, text.find(':') - (nested ? 2 : 0));
    if (!nested && text.back() == ':') {
      section = name;
      continue;
    }
    printed.push_back(nested ? section + "." + name : name);
  }
  // gpt_pretrain reads no recipe section: only the common keys are printed, without model.moe
  // for a model that has no MoE block (test_moe_recipe.cpp prints them for one that has) and
  // without model.rope_scaling for one whose rotary frequencies are not scaled.
  std::set<std::string> sections;
  for (const ConfigSection& section : config_sections()) sections.insert(section.name);
  std::vector<std::string> schema;
  for (const ConfigKey& key : config_schema())
    if (!sections.count(key.path.substr(0, key.path.find('.'))) &&
        key.path.rfind("model.moe.", 0) != 0 && key.path.rfind("model.rope_scaling.", 0) != 0)
      schema.push_back(key.path);
  EXPECT_EQ(printed, schema) << yaml;
  EXPECT_NE(yaml.find("\nmodel:\n  arch: gpt\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  betas: [0.9, 0.999]\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  eps: 1.0e-08\n"), std::string::npos) << yaml;  // a float to YAML 1.1 too
}

// ---- the recipe registry and recipe sections --------------------------------------------------

const std::string kBert = "recipe: bert_pretrain\nmodel: {arch: bert, vocab_size: 260}\ndata:\n"
                          "  train: " + std::string(kTiny) +
                          "\n  special_tokens: ['[PAD]', '[CLS]', '[SEP]', '[MASK]']\n";

TEST(ConfigRegistry, RecipeChoicesComeFromTheRegistry) {
  std::vector<std::string> names;
  for (const RecipeSpec& recipe : recipe_registry()) {
    names.push_back(recipe.name);
    EXPECT_FALSE(recipe.doc.empty()) << recipe.name;
    EXPECT_FALSE(recipe.families.empty()) << recipe.name;
    EXPECT_TRUE(recipe.train && recipe.eval && recipe.estimate) << recipe.name;
    for (const std::string& section : recipe.sections)
      EXPECT_TRUE(std::any_of(config_sections().begin(), config_sections().end(),
                              [&](const ConfigSection& s) { return s.name == section; }))
          << recipe.name << " reads an unknown section " << section;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"gpt_pretrain", "bert_pretrain", "finetune", "distill",
                                      "classify", "reward_model", "dpo", "ppo", "grpo"}));
  EXPECT_EQ(find_config_key("recipe")->choices, names);
  EXPECT_EQ(&find_recipe("bert_pretrain"), &recipe_registry()[1]);
  try {
    find_recipe("rlhf");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    EXPECT_EQ(std::string(e.what()),
              "unknown recipe 'rlhf' (known recipes: gpt_pretrain, bert_pretrain, finetune, "
              "distill, classify, reward_model, dpo, ppo, grpo)");
  }
  EXPECT_EQ(recipes_reading("bert"), (std::vector<std::string>{"bert_pretrain", "distill"}));
  EXPECT_EQ(recipes_reading("preference"), (std::vector<std::string>{"reward_model", "dpo"}));
  EXPECT_EQ(recipes_reading("lora"), (std::vector<std::string>{"finetune", "dpo", "ppo", "grpo"}));
  // Section keys are schema keys, after the common ones, under their section's name.
  for (const ConfigSection& section : config_sections())
    for (const ConfigKey& key : section.keys) {
      EXPECT_EQ(key.path.rfind(section.name + ".", 0), 0u) << key.path;
      EXPECT_EQ(find_config_key(key.path), &*std::find_if(
                                                config_schema().begin(), config_schema().end(),
                                                [&](const ConfigKey& k) { return k.path == key.path; }));
    }
}

// Lists of integers take integers only, each within the key's range, each error at its element.
TEST(ConfigValues, IntegerListsNameTheBadElement) {
  const std::string distill = "recipe: distill\ndata: {train: " + std::string(kTiny) + "}\n";
  EXPECT_EQ(errors_of(distill + "distill: {init_from_teacher: blocks, teacher_blocks: [1, 2.5, -1, x]}\n"),
            line("x.yaml:3:58", "distill.teacher_blocks[1]: expected an integer, got '2.5'") + "\n" +
                line("x.yaml:3:63", "distill.teacher_blocks[2]: must be >= 0, got -1") + "\n" +
                line("x.yaml:3:67", "distill.teacher_blocks[3]: expected an integer, got 'x'") +
                "\n" + line("x.yaml", "distill.teacher: recipe distill needs a teacher; name its "
                                       "run directory or checkpoint"));
  EXPECT_EQ(errors_of(distill, {"distill.teacher_blocks=3"}),
            line("override 'distill.teacher_blocks=3'",
                 "distill.teacher_blocks: expected a list of integers, got '3'") +
                "\n" + line("x.yaml", "distill.teacher: recipe distill needs a teacher; name its "
                                       "run directory or checkpoint"));
  RunConfig c = load_config_string(distill + "distill: {teacher: runs/t, init_from_teacher: "
                                   "blocks, teacher_blocks: [4, 0, 2, 6]}\n",
                                   "x.yaml", {"model.n_layers=4"}, ConfigFiles::skip);
  EXPECT_EQ(c.get<std::vector<int64_t>>("distill.teacher_blocks"),
            (std::vector<int64_t>{4, 0, 2, 6}));
  EXPECT_NE(to_yaml(c).find("  teacher_blocks: [4, 0, 2, 6]\n"), std::string::npos);
  EXPECT_EQ(load_config_string(to_yaml(c), "y.yaml", {}, ConfigFiles::skip), c);
}

TEST(ConfigSections, NotReadByTheRecipeIsOneErrorAtTheSection) {
  EXPECT_EQ(errors_of(minimal("bert: {mask_prob: 0.2, eval_pairs: 5}\n")),
            line("x.yaml:4:1", "section 'bert' is not read by recipe gpt_pretrain (it is read by: "
                               "bert_pretrain, distill)"));
  EXPECT_EQ(errors_of(minimal(), {"bert.mask_prob=0.2"}),
            line("override 'bert.mask_prob=0.2'",
                 "section 'bert' is not read by recipe gpt_pretrain (it is read by: "
                 "bert_pretrain, distill)"));
  // The recipe may come after the section, or from an override.
  EXPECT_NO_THROW(load_config_string(kBert, "x.yaml", {"bert.mask_prob=0.2"}));
  EXPECT_EQ(errors_of("bert: {eval_pairs: 5}\n" + kBert, {"recipe=gpt_pretrain",
                                                           "model.arch=gpt"}),
            line("x.yaml:1:1", "section 'bert' is not read by recipe gpt_pretrain (it is read by: "
                               "bert_pretrain, distill)"));
}

TEST(BertSection, HoldsEveryKeyOfTheSection) {
  testing::expect_every_key_reaches_its_field<BertSection>(
      bert_section(), kBert, bert_settings,
      {{{"bert.type_vocab_size=3"}, [](const BertSection& s) { EXPECT_EQ(s.type_vocab_size, 3); }},
       {{"bert.mask_prob=0.3"}, [](const BertSection& s) { EXPECT_EQ(s.mask_prob, 0.3); }},
       {{"bert.eval_pairs=64"}, [](const BertSection& s) { EXPECT_EQ(s.eval_pairs, 64); }},
       {{"bert.paragraphs_per_document=2"},
        [](const BertSection& s) { EXPECT_EQ(s.paragraphs_per_document, 2); }},
       {{"bert.sentence_breaks=true"},
        [](const BertSection& s) { EXPECT_TRUE(s.sentence_breaks); }}});
}

TEST(ConfigSections, KeysHaveDefaultsOverridesRangesAndRoundTrip) {
  RunConfig d = default_config();
  EXPECT_EQ(d.get<int64_t>("bert.type_vocab_size"), 2);
  EXPECT_EQ(d.get<double>("bert.mask_prob"), 0.15);
  EXPECT_EQ(d.get<int64_t>("bert.eval_pairs"), 2048);
  EXPECT_EQ(d.get<int64_t>("bert.paragraphs_per_document"), 1);
  EXPECT_FALSE(d.get<bool>("bert.sentence_breaks"));
  RunConfig c = load_config_string(kBert + "bert: {mask_prob: 0.2, sentence_breaks: true}\n",
                                   "x.yaml", {"bert.eval_pairs=64"});
  BertSection b = bert_settings(c);
  EXPECT_EQ(b.mask_prob, 0.2);
  EXPECT_TRUE(b.sentence_breaks);
  EXPECT_EQ(b.eval_pairs, 64);
  EXPECT_EQ(b.type_vocab_size, 2);
  EXPECT_EQ(b.paragraphs_per_document, 1);
  EXPECT_EQ(errors_of(kBert + "bert: {mask_prob: 1.5}\n"),
            line("x.yaml:6:19", "bert.mask_prob: must be in (0, 1), got 1.5"));
  EXPECT_EQ(errors_of(kBert + "bert: {mask_porb: 0.2}\n"),
            line("x.yaml:6:8", "unknown key 'bert.mask_porb' (did you mean 'mask_prob'?)"));
  // The resolved config shows the active recipe's own section, and loads back to the same config.
  std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("\nbert:\n  type_vocab_size: 2\n  mask_prob: 0.2\n  eval_pairs: 64\n"),
            std::string::npos)
      << yaml;
  RunConfig back = load_config_string(yaml, "config.yaml");
  EXPECT_EQ(back, c);
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(to_yaml(load_config_string(minimal(), "x.yaml")).find("bert"), std::string::npos);
  // Typed access names the key it cannot give.
  try {
    (void)c.get<int64_t>("bert.mask_prob");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::internal);
    EXPECT_NE(std::string(e.what()).find("'bert.mask_prob'"), std::string::npos) << e.what();
  }
  try {
    (void)c.get<double>("nosuch.alpha");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::internal);
    EXPECT_NE(std::string(e.what()).find("'nosuch.alpha'"), std::string::npos) << e.what();
  }
}

TEST(ConfigSections, OldBertSpellingsSuggestTheNewKeys) {
  EXPECT_EQ(errors_of(minimal("  mask_prob: 0.2\n")),
            line("x.yaml:4:3", "unknown key 'data.mask_prob' (did you mean 'bert.mask_prob'?)"));
  for (const std::string old : {"data.mask_prob", "data.eval_pairs", "data.paragraphs_per_document",
                                "data.sentence_breaks", "model.type_vocab_size"}) {
    std::string now = "bert." + old.substr(old.find('.') + 1);
    EXPECT_EQ(errors_of(kBert, {old + "=1"}),
              line("override '" + old + "=1'",
                   "unknown key '" + old + "' (did you mean '" + now + "'?)"));
  }
}

TEST(ConfigSections, StoredConfigsWithTheOldBertSpellingsStillLoad) {
  // Checkpoints written before the keys moved hold them in data: and model:.
  const std::string old_bert = kBert + std::string("  mask_prob: 0.25\n  eval_pairs: 64\n");
  RunConfig bert = load_config_string(old_bert, "stored", {}, ConfigFiles::skip);
  EXPECT_EQ(bert.get<double>("bert.mask_prob"), 0.25);
  EXPECT_EQ(bert.get<int64_t>("bert.eval_pairs"), 64);
  // A GPT run printed them too; they mean nothing to it and are dropped.
  RunConfig gpt = load_config_string(minimal("  mask_prob: 0.25\n"), "stored", {}, ConfigFiles::skip);
  EXPECT_EQ(to_yaml(gpt).find("mask_prob"), std::string::npos);
  // In a user's file they are still mistakes.
  EXPECT_NE(errors_of(old_bert).find("did you mean 'bert.mask_prob'"), std::string::npos);
}

// ---- checkpoint keys and model.init_from --------------------------------------------------------

// A run directory holding one checkpoint whose stored config is `config_yaml`.
std::filesystem::path write_run(const std::filesystem::path& dir, const std::string& config_yaml) {
  CheckpointData data;
  data.step = 2;
  data.config_yaml = config_yaml;
  data.model = {{"w", zeros({2})}};
  save_checkpoint(dir, data, 0);
  return dir;
}

// Loads `text` expecting Error(checkpoint); returns its message.
std::string checkpoint_error_of(const std::string& text,
                                const std::vector<std::string>& overrides = {}) {
  try {
    load_config_string(text, "x.yaml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::checkpoint) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a checkpoint error for:\n" << text;
  return "";
}

TEST(ConfigCheckpoint, AKeyNamesARunDirectoryOrACheckpointFile) {
  EXPECT_EQ(find_config_key("model.init_from")->type, ConfigType::checkpoint);
  EXPECT_EQ(config_type_name(*find_config_key("model.init_from")), "checkpoint");
  testing::TempDir tmp;
  std::string run = write_run(tmp.path() / "base", to_yaml(load_config_string(minimal(), "x.yaml")))
                        .string();
  RunConfig c = load_config_string(minimal(), "x.yaml", {"model.init_from=" + run});
  EXPECT_EQ(c.model.init_from, run);
  std::string file = latest_checkpoint(run)->string();
  EXPECT_EQ(load_config_string(minimal(), "x.yaml", {"model.init_from=" + file}).model.init_from,
            file);
  // Not a config mistake: exit 4, with the message resolve_checkpoint gives.
  std::string empty = (tmp.path() / "empty").string();
  std::filesystem::create_directories(empty);
  EXPECT_EQ(checkpoint_error_of(minimal(), {"model.init_from=" + empty}),
            empty + ": no checkpoint in this run directory");
  EXPECT_EQ(checkpoint_error_of(minimal("model: {init_from: runs/nope}\n")),
            "runs/nope: no such checkpoint file or run directory");
  // Config problems come first, with exit 2.
  EXPECT_EQ(errors_of(minimal("model: {init_from: runs/nope, dropout: 2.0}\n")),
            line("x.yaml:4:40", "model.dropout: must be in [0, 1), got 2.0"));
  // A config read back from a checkpoint does not follow it.
  EXPECT_NO_THROW(load_config_string(minimal("model: {init_from: runs/nope}\n"), "ckpt", {},
                                     ConfigFiles::skip));
}

TEST(ConfigInitFrom, TheWeightsFixTheArchitecture) {
  std::set<std::string> fixed;
  for (const ConfigKey& key : config_schema())
    if (key.architecture) fixed.insert(key.path);
  EXPECT_EQ(fixed, (std::set<std::string>{
                       "model.arch", "model.vocab_size", "model.context", "model.d_model",
                       "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.head_dim",
                       "model.bias", "model.qkv_bias", "model.fused_qkv", "model.norm",
                       "model.position", "model.mlp", "model.ffn_mult", "model.ffn_hidden",
                       "model.tie_embeddings", "model.moe.every", "model.moe.n_experts",
                       "model.moe.top_k", "model.moe.ffn_mult", "model.moe.noisy",
                       "model.rope_theta", "model.rope_scaling.type", "model.rope_scaling.factor",
                       "model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor",
                       "model.rope_scaling.original_context", "model.norm_eps",
                       "model.norm_placement",
                       "data.tokenizer", "data.special_tokens", "bert.type_vocab_size", "classify.labels",
                                   "classify.hidden"}));
  testing::TempDir tmp;
  RunConfig base = load_config_string(
      minimal("model: {d_model: 64, n_layers: 3, norm: rmsnorm, dropout: 0.1}\n"), "base.yaml");
  std::string run = write_run(tmp.path() / "base", to_yaml(base)).string();
  // Left out: taken from the checkpoint (and derived keys follow); dropout is not fixed.
  RunConfig c = load_config_string(minimal("model: {init_from: " + run + ", dropout: 0.2}\n"),
                                   "x.yaml");
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_EQ(c.model.norm, "rmsnorm");
  EXPECT_EQ(c.model.dropout, 0.2);
  EXPECT_EQ(c.schedule.noam_d_model, 64);
  // Set to the same value: fine; to another: an error at that key.
  EXPECT_NO_THROW(load_config_string(minimal("model: {init_from: " + run + ", d_model: 64}\n"),
                                     "x.yaml"));
  EXPECT_EQ(errors_of(minimal("model:\n  init_from: " + run + "\n  d_model: 256\n"),
                      {"model.norm=layernorm"}),
            line("x.yaml:6:12", "model.d_model: the config says 256, but model.init_from '" + run +
                                    "' was trained with 64") +
                "\n" +
                line("override 'model.norm=layernorm'",
                     "model.norm: the config says layernorm, but model.init_from '" + run +
                         "' was trained with rmsnorm"));
}

// Learned positions are weights of `context` rows; rotary ones are not, so a run may train a
// rotary base (a hub Llama: 8k to 128k positions) on sequences of its own length.
TEST(ConfigInitFrom, ARotaryModelsContextIsTheRunsChoice) {
  testing::TempDir tmp;
  for (const char* position : {"learned", "rotary"}) {
    RunConfig base = load_config_string(
        minimal(std::string("model: {context: 64, position: ") + position + "}\n"), "base.yaml");
    std::string run = write_run(tmp.path() / position, to_yaml(base)).string();
    EXPECT_EQ(load_config_string(minimal("model: {init_from: " + run + "}\n"), "x.yaml")
                  .model.context,
              64);
    const std::string shorter = minimal("model: {init_from: " + run + ", context: 32}\n");
    if (std::string(position) == "rotary")
      EXPECT_EQ(load_config_string(shorter, "x.yaml").model.context, 32);
    else
      EXPECT_EQ(errors_of(shorter),
                line("x.yaml:4:" + std::to_string(31 + run.size()),
                     "model.context: the config says 32, but model.init_from '" + run +
                         "' was trained with 64"));
  }
}

TEST(ConfigInitFrom, SectionKeysCountWhenBothRecipesReadTheSection) {
  testing::TempDir tmp;
  RunConfig base = load_config_string(kBert + "bert: {type_vocab_size: 3, mask_prob: 0.3}\n",
                                      "base.yaml");
  std::string run = write_run(tmp.path() / "bert", to_yaml(base)).string();
  RunConfig c = load_config_string(kBert, "x.yaml", {"model.init_from=" + run});
  EXPECT_EQ(c.get<int64_t>("bert.type_vocab_size"), 3);
  EXPECT_EQ(c.get<double>("bert.mask_prob"), 0.15);  // not fixed by the weights
  EXPECT_EQ(errors_of(kBert + "bert: {type_vocab_size: 2}\n", {"model.init_from=" + run}),
            line("x.yaml:6:25", "bert.type_vocab_size: the config says 2, but model.init_from '" +
                                    run + "' was trained with 3"));
  // A gpt_pretrain config from that checkpoint does not read bert: and gets the bert family,
  // which its recipe refuses.
  EXPECT_EQ(errors_of(minimal(), {"model.init_from=" + run}),
            line("x.yaml:1:9", "recipe gpt_pretrain trains model.arch 'gpt', the config says "
                               "'bert'"));
}

TEST(ConfigInitFrom, AStoredConfigThatDoesNotLoadIsACheckpointError) {
  testing::TempDir tmp;
  std::string run = write_run(tmp.path() / "bad", "recipe: gpt_pretrain\nzebra: 1\n").string();
  std::string file = latest_checkpoint(run)->string();
  std::string message = checkpoint_error_of(minimal(), {"model.init_from=" + run});
  EXPECT_EQ(message.rfind(file + ": the stored config does not load: ", 0), 0u) << message;
  EXPECT_NE(message.find("unknown key 'zebra'"), std::string::npos) << message;
}

// ---- optimizer.layer_lr_decay ------------------------------------------------------------------

// ULMFiT's factor from the YAML key to each group: 4 blocks, D = 2.
TEST(ConfigLayerLrDecay, DividesTheRatePerBlockGoingDown) {
  RunConfig c = load_config_string(minimal("optimizer: {layer_lr_decay: 2}\n"), "x.yaml");
  NamedTensors params = {{"tok_emb.weight", zeros({4, 2})}};
  for (int i = 0; i < 4; ++i)
    params.push_back({"blocks." + std::to_string(i) + ".w", zeros({2, 2})});
  params.push_back({"ln_f.weight", zeros({2})});
  params.push_back({"head.weight", zeros({4, 2})});
  std::unique_ptr<optim::Optimizer> opt = build_optimizer(c, params);
  std::map<std::string, double> mult;
  for (const optim::ParamGroup& g : opt->groups())
    for (const NamedTensor& p : g.params) mult[p.name] = g.lr_mult;
  EXPECT_EQ(mult, (std::map<std::string, double>{{"tok_emb.weight", 1.0 / 16},
                                                  {"blocks.0.w", 1.0 / 8},
                                                  {"blocks.1.w", 1.0 / 4},
                                                  {"blocks.2.w", 1.0 / 2},
                                                  {"blocks.3.w", 1.0},
                                                  {"ln_f.weight", 1.0},
                                                  {"head.weight", 1.0}}));
  EXPECT_NO_THROW(load_config_string(minimal("optimizer: {layer_lr_decay: 2.6}\n"), "x.yaml"));
}

// ---- docs/config.md ---------------------------------------------------------------------------

std::string strip_backticks(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '`'), s.end());
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Rows `| key | type | default | allowed | meaning |` under "## Top-level keys" and "## `section`".
TEST(ConfigDocs, EveryKeyIsDocumented) {
  std::ifstream in("docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md not found (tests run from the repository root)";
  std::map<std::string, std::vector<std::string>> rows;
  std::optional<std::string> section;
  std::string text;
  while (std::getline(in, text)) {
    if (text.rfind("## ", 0) == 0) {
      std::string heading = text.substr(3);
      if (heading == "Top-level keys")
        section = "";
      else if (heading.size() > 2 && heading.front() == '`' && heading.back() == '`')
        section = heading.substr(1, heading.size() - 2);
      else
        section.reset();
      continue;
    }
    if (!section || text.rfind("| `", 0) != 0) continue;
    // Cells split at '|' except the escaped "\|" that a value containing a pipe needs.
    std::vector<std::string> cells(1);
    for (size_t i = 1; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == '|')
        cells.back() += text[++i];
      else if (text[i] == '|')
        cells.emplace_back();
      else
        cells.back() += text[i];
    }
    cells.pop_back();  // after the closing '|'
    for (std::string& cell : cells) cell = trim(cell);
    ASSERT_EQ(cells.size(), 5u) << text;
    std::string path = (section->empty() ? "" : *section + ".") + strip_backticks(cells[0]);
    EXPECT_FALSE(rows.count(path)) << "documented twice: " << path;
    rows[path] = cells;
  }
  for (const ConfigKey& key : config_schema()) {
    auto it = rows.find(key.path);
    if (it == rows.end()) {
      ADD_FAILURE() << "docs/config.md does not document '" << key.path << "'";
      continue;
    }
    const auto& cells = it->second;
    EXPECT_EQ(cells[1], config_type_name(key)) << key.path;
    EXPECT_EQ(strip_backticks(cells[2]), config_default_text(key)) << key.path;
    EXPECT_EQ(strip_backticks(cells[3]), config_allowed_text(key)) << key.path;
    EXPECT_FALSE(cells[4].empty()) << key.path;
    rows.erase(it);
  }
  for (const auto& [path, cells] : rows)
    ADD_FAILURE() << "docs/config.md documents '" << path << "', which the schema does not know";
}

TEST(ConfigShipped, EveryConfigLoadsAndOpensWithItsCommand) {
  // Files are not checked: configs that build on other runs name run directories that exist only
  // after their header's first commands.
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("configs")) {
    if (entry.path().extension() != ".yaml") continue;
    std::string text = testing::read_file(entry.path());
    EXPECT_EQ(text.rfind("# " + entry.path().string(), 0), 0u) << entry.path();
    EXPECT_NE(text.find("scripts/forge train " + entry.path().string()), std::string::npos)
        << entry.path();
    RunConfig c = load_config_string(text, entry.path().string(), {}, ConfigFiles::skip);
    EXPECT_FALSE(c.recipe.empty()) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 7);
}

}  // namespace
}  // namespace forge
