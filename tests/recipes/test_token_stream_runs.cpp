// Training on streamed token datasets through the forge binary: a shard directory trains exactly as
// the same tokens in one file do, and a resumed run refuses a dataset whose contents changed since
// its checkpoint (exit 3, naming the split's key), leaving the run as it was.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/durable_file.h"
#include "data/token_dataset.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge::testing {
namespace {

namespace fs = std::filesystem;

class TokenStreamRun : public RecipeTest {
 protected:
  // corpus.txt's lines as documents, the last `drop` left out.
  std::vector<std::vector<int32_t>> documents(size_t drop = 0) const {
    std::ifstream in(dir_ / "corpus.txt", std::ios::binary);
    std::vector<std::vector<int32_t>> docs;
    for (std::string line; std::getline(in, line);) {
      line += '\n';
      docs.emplace_back(line.begin(), line.end());
    }
    docs.resize(docs.size() - drop);
    return docs;
  }
  static TokenizerInfo bytes_info() {
    auto t = make_tokenizer("bytes");
    return {t->name(), t->vocab_size(), vocabulary_hash(*t)};
  }
  void write_file(const fs::path& path, const std::vector<std::vector<int32_t>>& docs) const {
    TokenDatasetWriter w(path, bytes_info());
    for (const auto& d : docs) w.add_document(d);
    w.finish();
  }
  void write_config(const fs::path& data) const {
    std::ofstream(dir_ / "run.yaml")
        << "recipe: gpt_pretrain\nseed: 7\n"
        << "model: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
           "n_heads: 2}\n"
        << "data: {tokenizer: bytes, train: " << data.string() << ", val_fraction: 0.1}\n"
        << "optimizer: {name: adamw, lr: 3.0e-3}\n"
        << "train: {batch_size: 4, max_steps: 4, save_every: 2, eval_every: 2, eval_batches: 2, "
           "log_every: 1, sample_tokens: 1}\n";
  }
  // Every file under `dir` with its contents, in order; not the lock, which holds the last pid.
  static std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.path().filename() != "train.lock")
          out.push_back(e.path().string() + " " +
                      (e.is_regular_file() ? read_file(e.path()) : std::string()));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::pair<int, std::string> train(const fs::path& run, const std::string& extra = "") {
    return forge_output("train " + (dir_ / "run.yaml").string() + " output_dir=" + run.string() +
                        extra);
  }
};

TEST_F(TokenStreamRun, ShardsTrainAsOneFile) {
  const auto docs = documents();
  write_file(dir_ / "corpus.h5", docs);
  fs::create_directories(dir_ / "shards");
  ShardManifest m;
  m.tokenizer = bytes_info();
  const size_t cut = docs.size() / 3;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::vector<int32_t>> part(docs.begin() + (i ? ptrdiff_t(cut) : 0),
                                           i ? docs.end() : docs.begin() + ptrdiff_t(cut));
    const std::string name = "part-" + std::to_string(i) + ".h5";
    write_file(dir_ / "shards" / name, part);
    int64_t tokens = 0;
    for (const auto& d : part) tokens += int64_t(d.size());
    m.shards.push_back({name, tokens, int64_t(part.size()),
                        file_digest(dir_ / "shards" / name, ExitCode::data)});
  }
  write_shard_manifest(dir_ / "shards", m);
  write_config(dir_ / "corpus.h5");
  ASSERT_EQ(train(dir_ / "file").first, 0);
  write_config(dir_ / "shards");
  const auto [code, out] = train(dir_ / "sharded");
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(train_lines(dir_ / "file", {"loss", "grad_norm"}),
            train_lines(dir_ / "sharded", {"loss", "grad_norm"}));
  EXPECT_EQ(losses(dir_ / "file", "val"), losses(dir_ / "sharded", "val"));
}

TEST_F(TokenStreamRun, AResumeRefusesADatasetThatChanged) {
  const fs::path data = dir_ / "corpus.h5", run = dir_ / "run";
  write_file(data, documents());
  write_config(data);
  ASSERT_EQ(train(run, " train.max_steps=2").first, 0);
  const CheckpointInfo info = read_checkpoint_info(resolve_checkpoint(run));
  EXPECT_EQ(info.counters.at("dataset.data.train.tokens"),
            open_token_dataset_reader(data).num_tokens());
  ASSERT_EQ(train(run).first, 0);  // the same data resumes

  write_file(data, documents(1));  // rewritten without its last line
  const std::vector<std::string> before = listing(run);
  const auto [code, out] = train(run, " train.max_steps=6");
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("forge: data error: data.train: " + data.string() +
                     ": the dataset changed since "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("use another output_dir, or train.resume: never"), std::string::npos) << out;
  EXPECT_EQ(listing(run), before);
}

}  // namespace
}  // namespace forge::testing
