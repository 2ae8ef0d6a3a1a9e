// Config loading against the schema: values and defaults, every error kind with its exact line
// (file:line:col and message), did-you-mean, overrides, derived defaults, cross-field checks, the
// resolved-config round trip, and docs/config.md staying in step with the schema.
// Tests run from the repository root, so fixture paths are repo-relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "recipes/config.h"
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
  EXPECT_EQ(c, want);
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
  // DESIGN.md §1's example, at the same line and column.
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
  EXPECT_EQ(errors_of(minimal("optimizer: {layer_lr_decay: 1.01}\n")),
            line("x.yaml:4:29", "optimizer.layer_lr_decay: must be in (0, 1], got 1.01"));
  EXPECT_EQ(errors_of(minimal("train: {batch_size: 0}\n")),
            line("x.yaml:4:21", "train.batch_size: must be >= 1, got 0"));
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
            line("x.yaml:1:9", "recipe: must be one of gpt_pretrain, bert_pretrain; got 'gpt_pretrian' "
                               "(did you mean 'gpt_pretrain'?)"));
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
            line("x.yaml:4:14", "data.tokenizer: 'nope/dir' is not bytes, gpt2 or a directory "
                                "with encoder.json and vocab.bpe"));
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
  std::vector<std::string> schema;
  for (const ConfigKey& key : config_schema()) schema.push_back(key.path);
  EXPECT_EQ(printed, schema) << yaml;
  EXPECT_NE(yaml.find("\nmodel:\n  arch: gpt\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  betas: [0.9, 0.999]\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  eps: 1.0e-08\n"), std::string::npos) << yaml;  // a float to YAML 1.1 too
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
    std::vector<std::string> cells;
    std::stringstream row(text.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(trim(cell));
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

}  // namespace
}  // namespace forge
