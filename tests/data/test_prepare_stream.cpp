// forge prepare at scale: inputs streamed in blocks of any size give the dataset whole files give,
// memory does not grow with an input, shards end at document boundaries, a killed prepare leaves
// nothing that looks complete, outputs it must not replace are refused, and progress never floods.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <random>

#include "core/durable_file.h"
#include "data/token_shards.h"
#include "tests/data/prepare_checks.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::contents;
using testing::expected_contents;
using testing::TempDir;
using testing::with_threads;
using testing::write_file;

// gpt2 with "\nSTOP" as an added token, which a cut at a line start could split: a cut is safe only
// when the text after it is known, so this catches one decided at the end of a block. Counts the
// texts encoded, to show that documents were cut into parts.
class CountingTokenizer final : public Tokenizer {
 public:
  CountingTokenizer() : inner_(make_tokenizer("gpt2", {"\nSTOP"})) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    ++encodes;
    return inner_->encode(text);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    return inner_->decode(ids);
  }
  std::vector<size_t> independent_cuts(std::string_view text, size_t every) const override {
    return inner_->independent_cuts(text, every);
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  std::string name() const override { return inner_->name(); }

  mutable std::atomic<int64_t> encodes{0};

 private:
  std::unique_ptr<Tokenizer> inner_;
};

// Records of every shape the splitters know, with "\nSTOP" after lines a cut could follow.
std::vector<fs::path> tricky_inputs(const fs::path& dir) {
  const std::string shakespeare = testing::read_file("data/samples/tinyshakespeare.txt");
  std::mt19937 rng(7);
  std::string text;
  for (int r = 0; r < 60; ++r) {
    const size_t at = rng() % (shakespeare.size() - 3000);
    std::string record = shakespeare.substr(at, 40 + rng() % 1500);
    if (r % 3 == 0) record += "Done.\nSTOP the <|endoftext|> here.\nAnd on.\n";
    const char* separators[] = {"\n%\n", "\n%\r\n", "\n%x\n", "\n\n%\n%\n", "\n \n%\n"};
    text += record + separators[rng() % 5];
  }
  std::vector<fs::path> files;
  auto file = [&](const std::string& name, const std::string& body) {
    files.push_back(dir / name);
    write_file(files.back(), body);
  };
  file("a.txt", text);
  file("empty.txt", "");
  file("blank.txt", " \n\t\r\n");
  file("b.txt", text.substr(0, text.size() / 3) + "\nlast line, no newline\n%");
  file("c.txt", "%\n%\nx\r\n%\r\n" + text.substr(text.size() / 2));
  return files;
}

// Every block, chunk and part size, down to one byte, gives the dataset of whole files, in every
// format and with one thread or four; the small part sizes cut large records as they stream.
TEST(PrepareStream, BlockChunkAndPartSizesNeverChangeTheDataset) {
  TempDir dir;
  const std::vector<fs::path> inputs = tricky_inputs(dir.path());
  const CountingTokenizer tok;
  struct Sizes {
    size_t block, chunk, part;
  };
  for (RecordFormat format : {RecordFormat::file, RecordFormat::percent, RecordFormat::lines}) {
    const auto expected = expected_contents(tok, inputs, format);
    for (Sizes s : {Sizes{1, 1, 16}, Sizes{3, 50, 16}, Sizes{7, 300, 100}, Sizes{64, 1, 40},
                    Sizes{4096, size_t(1) << 20, size_t(256) << 10}}) {
      for (int threads : {1, 4}) {
        SCOPED_TRACE(::testing::Message() << "format " << int(format) << " block " << s.block
                                        << " chunk " << s.chunk << " part " << s.part
                                        << " threads " << threads);
        const fs::path out = dir.path() / "out.h5";
        tok.encodes = 0;
        const PrepareStats stats = with_threads(threads, [&] {
          return prepare_dataset(tok, inputs, out,
                                 {.format = format, .overwrite = true, .block_bytes = s.block,
                                  .chunk_bytes = s.chunk, .part_bytes = s.part});
        });
        EXPECT_EQ(stats.documents, int64_t(expected.first.size()) - 1);
        EXPECT_TRUE(contents(out) == expected);
        // Lines hold no line start to cut at; larger records are cut when parts are small.
        if (format != RecordFormat::lines && s.part < 1000) {
          EXPECT_GT(tok.encodes.load(), stats.documents);
        }
      }
    }
  }
}

// A 12 MB input is read a block at a time: the reader never holds more than a few blocks of it,
// whether it is one document cut as it streams or many lines.
TEST(PrepareStream, MemoryDoesNotGrowWithTheInput) {
  TempDir dir;
  const std::string shakespeare = testing::read_file("data/samples/tinyshakespeare.txt");
  std::string big;
  while (big.size() < (size_t(12) << 20)) big += shakespeare;
  write_file(dir.path() / "big.txt", big);
  const auto gpt2 = make_tokenizer("gpt2");
  for (RecordFormat format : {RecordFormat::file, RecordFormat::lines}) {
    const PrepareStats s = prepare_dataset(*gpt2, {dir.path() / "big.txt"}, dir.path() / "o.h5",
                                           {.format = format, .overwrite = true});
    EXPECT_EQ(s.bytes, int64_t(big.size()));
    EXPECT_LT(s.max_held_bytes, int64_t(4) << 20) << int(format);
  }
}

// Lines of 1 to 40 words, one document each.
fs::path numbered_lines(const fs::path& dir, int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += "line " + std::to_string(i);
    for (int w = 0; w < i % 40; ++w) text += " word";
    text += "\n";
  }
  write_file(dir / "lines.txt", text);
  return dir / "lines.txt";
}

// Each shard ends at the first document boundary at or past the size, the manifest lists them
// with their digests, and the shards end to end are the one-file dataset.
TEST(PrepareStream, ShardsEndAtTheFirstDocumentBoundaryPastTheSize) {
  TempDir dir;
  const fs::path in = numbered_lines(dir.path(), 150);
  const auto gpt2 = make_tokenizer("gpt2");
  prepare_dataset(*gpt2, {in}, dir.path() / "one.h5", {.format = RecordFormat::lines});
  const auto whole = contents(dir.path() / "one.h5");
  for (int64_t size : {int64_t(1), int64_t(300), int64_t(4000), int64_t(1) << 40}) {
    SCOPED_TRACE(size);
    const fs::path out = dir.path() / "shards";
    const PrepareStats s = with_threads(2, [&] {
      return prepare_dataset(*gpt2, {in}, out,
                             {.format = RecordFormat::lines, .shard_tokens = size,
                              .overwrite = true, .chunk_bytes = 700});
    });
    const ShardManifest m = read_shard_manifest(out);
    check_shard_files(out, m);
    ASSERT_EQ(int64_t(m.shards.size()), s.shards);
    EXPECT_EQ(m.tokenizer.name, "gpt2");
    testing::DatasetContents joined{{0}, {}};
    for (size_t i = 0; i < m.shards.size(); ++i) {
      const TokenShard& shard = m.shards[i];
      char name[32];
      std::snprintf(name, sizeof name, "shard-%05zu.h5", i);
      EXPECT_EQ(shard.file, name);
      EXPECT_EQ(shard.digest, file_digest(out / shard.file, ExitCode::data));
      const auto [offsets, tokens] = contents(out / shard.file);
      EXPECT_EQ(shard.num_tokens, int64_t(tokens.size()));
      ASSERT_GE(offsets.size(), 2u);
      if (i + 1 < m.shards.size()) {
        EXPECT_GE(offsets.back(), size);
        EXPECT_LT(offsets[offsets.size() - 2], size);
      }
      for (size_t d = 1; d < offsets.size(); ++d)
        joined.first.push_back(joined.first.back() + offsets[d] - offsets[d - 1]);
      joined.second.insert(joined.second.end(), tokens.begin(), tokens.end());
    }
    EXPECT_TRUE(joined == whole);
    if (size == 1) {
      EXPECT_EQ(s.shards, 150);
    }
    if (size == int64_t(1) << 40) {
      EXPECT_EQ(s.shards, 1);
    }
  }
  // Nothing is left beside the outputs.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"lines.txt", "one.h5", "one.h5.digest", "shards"}));
}

TEST(PrepareStream, NoDocumentsIsOneEmptyShard) {
  TempDir dir;
  write_file(dir.path() / "blank.txt", "\n \n");
  const PrepareStats s = prepare_dataset(*make_tokenizer("bytes"), {dir.path() / "blank.txt"},
                                         dir.path() / "out", {.shard_tokens = 10});
  EXPECT_EQ(s.shards, 1);
  const ShardManifest m = read_shard_manifest(dir.path() / "out");
  EXPECT_EQ(m.num_tokens(), 0);
  EXPECT_EQ(open_token_dataset(dir.path() / "out" / m.shards[0].file).num_documents(), 0);
}

// The names in `dir`, hidden ones included.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs prepare in a child process that SIGKILLs itself at its `kill_at`-th progress report.
void prepare_killed_at(int kill_at, const std::vector<fs::path>& inputs, const fs::path& out,
                       const PrepareOptions& options) {
  const pid_t pid = fork();
  if (pid == 0) {
    int reports = 0;
    PrepareOptions o = options;
    o.progress = [&](const PrepareProgress&) {
      if (++reports == kill_at) ::kill(::getpid(), SIGKILL);
    };
    try {
      prepare_dataset(*make_tokenizer("bytes"), inputs, out, o);
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
}

// Killed at the first, a middle or the last report before it finishes, a prepare leaves no output
// and nothing that looks like one (only a hidden partial directory or a .tmp file); an output it
// was replacing stays whole.
TEST(PrepareStream, AKilledPrepareLeavesNothingThatLooksComplete) {
  TempDir dir;
  const fs::path in = numbered_lines(dir.path(), 400);
  const auto bytes = make_tokenizer("bytes");
  int reports = 0;
  const PrepareOptions options{.format = RecordFormat::lines, .shard_tokens = 3000,
                               .chunk_bytes = 500};
  PrepareOptions counting = options;
  counting.progress = [&](const PrepareProgress&) { ++reports; };
  const fs::path previous = dir.path() / "previous";
  const PrepareStats first = prepare_dataset(*bytes, {in}, previous, counting);
  ASSERT_GT(first.shards, 3);
  ASSERT_GT(reports, 10);
  const std::string manifest = testing::read_file(previous / kShardManifestName);
  // The last report comes once the output is in place; the one before is the last chunk's.
  for (int kill_at : {1, reports / 2, reports - 1}) {
    SCOPED_TRACE(kill_at);
    for (const char* name : {"fresh", "fresh.h5"}) {
      const fs::path out = dir.path() / name;
      PrepareOptions o = options;
      if (out.extension() == ".h5") o.shard_tokens = 0;
      prepare_killed_at(kill_at, {in}, out, o);
      EXPECT_FALSE(fs::exists(out));
      for (const std::string& left : listing(dir.path()))
        EXPECT_TRUE(left == "lines.txt" || left == "previous" || left == "fresh.h5.tmp" ||
                    left.rfind(".fresh.partial-", 0) == 0 ||
                    left.rfind(".previous.partial-", 0) == 0)
            << left;
    }
    PrepareOptions replace = options;
    replace.overwrite = true;
    replace.shard_tokens = 6000;
    prepare_killed_at(kill_at, {in}, previous, replace);
    EXPECT_EQ(testing::read_file(previous / kShardManifestName), manifest);
    check_shard_files(previous, read_shard_manifest(previous));
  }
  // A later prepare under the same name completes; the partial one it finds of its own process
  // id (a recycled one) is no obstacle.
  fs::create_directory(dir.path() / (".fresh.partial-" + std::to_string(::getpid())));
  prepare_dataset(*bytes, {in}, dir.path() / "fresh", options);
  EXPECT_EQ(read_shard_manifest(dir.path() / "fresh").num_tokens(),
            read_shard_manifest(previous).num_tokens());
}

// A replaced shard directory and one prepare did not write; outputs that are or hold an input,
// including the temp file the one-file writer creates; a link there is not written through.
TEST(PrepareStream, RefusesOutputsItMustNotReplace) {
  TempDir dir;
  const fs::path in = numbered_lines(dir.path(), 50), out = dir.path() / "out";
  const auto bytes = make_tokenizer("bytes");
  auto prepare = [&](const fs::path& to, PrepareOptions o) {
    return prepare_dataset(*bytes, {in}, to, o);
  };
  const PrepareOptions shards{.format = RecordFormat::lines, .shard_tokens = 100};
  EXPECT_GT(prepare(out, shards).shards, 1);
  testing::expect_error(ExitCode::usage, "exists (pass --force", [&] { prepare(out, shards); });
  PrepareOptions force = shards;
  force.overwrite = true;
  force.shard_tokens = 1000000;
  EXPECT_EQ(prepare(dir.path() / "out/", force).shards, 1);  // "out/" names the directory
  EXPECT_EQ(listing(out), (std::vector<std::string>{"manifest.json", "shard-00000.h5",
                                                    "shard-00000.h5.digest"}));

  // A directory holding anything else is not prepare's to delete, even with --force.
  write_file(out / "notes.txt", "mine");
  testing::expect_error(ExitCode::usage, "is not a shard directory forge prepare wrote",
                        [&] { prepare(out, force); });
  EXPECT_EQ(testing::read_file(out / "notes.txt"), "mine");
  fs::create_directory(dir.path() / "plain");
  testing::expect_error(ExitCode::usage, "is not a shard directory",
                        [&] { prepare(dir.path() / "plain", force); });
  testing::expect_error(ExitCode::usage, "holds the input", [&] { prepare(dir.path(), force); });
  testing::expect_error(ExitCode::usage, "not a directory", [&] { prepare(in, force); });
  testing::expect_error(ExitCode::usage, "no directory",
                        [&] { prepare(dir.path() / "missing" / "out", force); });

  // The one-file writer's temp name is never an input, and a link there is replaced, not followed.
  const fs::path tmp_input = dir.path() / "t.h5.tmp";
  write_file(tmp_input, "text\n");
  testing::expect_error(ExitCode::usage, "is the input", [&] {
    prepare_dataset(*bytes, {tmp_input}, dir.path() / "t.h5", {});
  });
  EXPECT_EQ(testing::read_file(tmp_input), "text\n");
  const fs::path victim = dir.path() / "victim.txt";
  write_file(victim, "keep");
  fs::create_symlink(victim, dir.path() / "v.h5.tmp");
  prepare_dataset(*bytes, {in}, dir.path() / "v.h5", {});
  EXPECT_EQ(testing::read_file(victim), "keep");
}

// An input that shrinks or grows while it is read is a data error naming it, not a dataset of
// whatever was there. Tiny chunks keep the reader within the first file when the first report
// arrives, and the second file changes then.
TEST(PrepareStream, AnInputThatChangesWhileReadIsADataError) {
  TempDir dir;
  const fs::path first = numbered_lines(dir.path(), 2000), second = dir.path() / "second.txt";
  for (bool grow : {false, true}) {
    write_file(second, "one\ntwo\nthree\n");
    PrepareOptions o{.format = RecordFormat::lines, .overwrite = true, .chunk_bytes = 1};
    bool changed = false;
    o.progress = [&](const PrepareProgress&) {
      if (!changed) write_file(second, grow ? "one\ntwo\nthree\nfour\n" : "one\n");
      changed = true;
    };
    const std::string error = grow ? "grew past its 14 bytes" : "ended after 4 of its 14";
    testing::expect_error(ExitCode::data, error, [&] {
      prepare_dataset(*make_tokenizer("bytes"), {first, second}, dir.path() / "o.h5", o);
    });
    EXPECT_FALSE(fs::exists(dir.path() / "o.h5"));
  }
}

TEST(PrepareStream, UnreadableInputIsADataError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  write_file(dir.path() / "secret.txt", "text");
  fs::permissions(dir.path() / "secret.txt", fs::perms::none);
  testing::expect_error(ExitCode::data, "secret.txt: cannot read", [&] {
    prepare_dataset(*make_tokenizer("bytes"), {dir.path() / "secret.txt"}, dir.path() / "o.h5");
  });
}

TEST(PrepareStream, ShardSizesTakeSuffixes) {
  EXPECT_EQ(parse_token_count("x", "5000"), 5000);
  EXPECT_EQ(parse_token_count("x", "500k"), 500000);
  EXPECT_EQ(parse_token_count("x", "100M"), 100000000);
  EXPECT_EQ(parse_token_count("x", "2G"), 2000000000);
  for (const char* bad : {"0", "0M", "", "M", "-5", "+5", "1.5M", "10 M", "10T", "abc",
                          "9999999999999G", "99999999999999999999"})
    testing::expect_error(ExitCode::usage, "x: expected a positive number of tokens",
                          [&] { parse_token_count("x", bad); });
}

// The lines a printer writes to a file for `reports` reports spread over `seconds`.
std::string printed(bool terminal, int reports, double seconds) {
  std::FILE* f = std::tmpfile();
  PrepareProgressPrinter printer(f, terminal);
  const int64_t total = 1000000000;
  for (int i = 1; i <= reports; ++i)
    printer.update({total / reports * i, total, i, 3 * i}, seconds * i / reports);
  printer.finish({.tokens = 3 * reports, .bytes = total, .threads = 2}, seconds);
  std::string text(size_t(std::ftell(f)), '\0');
  std::rewind(f);
  EXPECT_EQ(std::fread(text.data(), 1, text.size(), f), text.size());
  std::fclose(f);
  return text;
}

// A terminal's line is rewritten at most four times a second; a log gets a line per 10% or 30 s.
TEST(PrepareStream, ProgressNeverFloods) {
  const std::string tty = printed(true, 100000, 10);
  EXPECT_LE(std::count(tty.begin(), tty.end(), '\r'), 42);
  EXPECT_EQ(std::count(tty.begin(), tty.end(), '\n'), 1);
  EXPECT_NE(tty.find("MB/s"), std::string::npos);
  EXPECT_NE(tty.find("ETA"), std::string::npos);
  const std::string log = printed(false, 100000, 10);
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 11);  // 10%, 20%, ... 100%, the summary
  EXPECT_EQ(log.find('\r'), std::string::npos);
  const std::string slow = printed(false, 100000, 3000);  // 50 minutes: every 30 s
  EXPECT_LE(std::count(slow.begin(), slow.end(), '\n'), 112);
  EXPECT_GE(std::count(slow.begin(), slow.end(), '\n'), 95);
  const std::string summary = log.substr(log.rfind("prepare:"));
  EXPECT_EQ(summary, "prepare: 300.0k tokens from 1000.0 MB in 10.0 s: 100.0 MB/s, 30.0k tokens/s "
                     "(2 threads)\n");
}

}  // namespace
}  // namespace forge
