// forge prepare's library half: record splitting and text -> token dataset round trips.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/data/prepare_checks.h"

namespace forge {
namespace {

using testing::TempDir;
using testing::with_threads;
using testing::write_file;

std::vector<std::string> docs(std::string_view text, RecordFormat f) {
  std::vector<std::string> out;
  for (std::string_view d : split_records(text, f)) out.emplace_back(d);
  return out;
}

TEST(Prepare, SplitsFilesRecordsAndLines) {
  const std::string fortunes = "A penny saved.\n%\nTwo lines\nof wisdom.\n%\n%\nLast one\n";
  EXPECT_EQ(docs(fortunes, RecordFormat::percent),
            (std::vector<std::string>{"A penny saved.\n", "Two lines\nof wisdom.\n", "Last one\n"}));
  EXPECT_EQ(docs("one\n\ntwo\r\nthree", RecordFormat::lines),
            (std::vector<std::string>{"one", "two\r", "three"}));
  EXPECT_EQ(docs("whole\nfile\n", RecordFormat::file), (std::vector<std::string>{"whole\nfile\n"}));
  EXPECT_TRUE(docs(" \n\t", RecordFormat::file).empty());
  EXPECT_THROW(parse_record_format("paragraphs"), Error);
}

TEST(Prepare, TextBecomesADatasetThatDecodesBack) {
  TempDir dir;
  write_file(dir.path() / "a.txt", "First record.\n%\nSecond, with <|endoftext|> inside.\n");
  write_file(dir.path() / "b.txt", "Third record.\n");
  auto tok = make_tokenizer("gpt2");
  PrepareStats s = prepare_dataset(*tok, {dir.path() / "a.txt", dir.path() / "b.txt"},
                                   dir.path() / "out.h5", {.format = RecordFormat::percent});
  EXPECT_EQ(s.files, 2);
  EXPECT_EQ(s.documents, 3);
  TokenizerInfo info{tok->name(), tok->vocab_size(), vocabulary_hash(*tok)};
  TokenDataset ds = open_token_dataset(dir.path() / "out.h5", &info, 50257);
  ASSERT_EQ(ds.num_documents(), 3);
  const auto& off = ds.doc_offsets();
  std::vector<int32_t> second(ds.tokens()->begin() + off[1], ds.tokens()->begin() + off[2]);
  EXPECT_EQ(tok->decode(second), "Second, with <|endoftext|> inside.\n");
  EXPECT_EQ(s.tokens, ds.num_tokens());

  // The same data read with another tokenizer is refused, naming both.
  auto bytes = make_tokenizer("bytes");
  TokenizerInfo other{bytes->name(), bytes->vocab_size(), vocabulary_hash(*bytes)};
  try {
    open_token_dataset(dir.path() / "out.h5", &other);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    std::string m = e.what();
    EXPECT_NE(m.find("gpt2"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes"), std::string::npos) << m;
  }
  EXPECT_NE(vocabulary_hash(*tok), vocabulary_hash(*bytes));
}

TEST(Prepare, MissingInputIsADataErrorAndWritesNothing) {
  TempDir dir;
  auto tok = make_tokenizer("bytes");
  EXPECT_THROW(prepare_dataset(*tok, {dir.path() / "missing.txt"}, dir.path() / "out.h5"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out.h5"));
}

TEST(Prepare, NeverWritesOverWhatExistsUnlessAsked) {
  TempDir dir;
  auto tok = make_tokenizer("bytes");
  const auto in = dir.path() / "in.txt", out = dir.path() / "out.h5";
  testing::write_file(in, "some text\n");
  // The output naming the input would replace the text with the dataset.
  EXPECT_EQ(testing::exit_code_of([&] { prepare_dataset(*tok, {in}, in); }), ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { prepare_dataset(*tok, {in}, in, {.overwrite = true}); }),
            ExitCode::usage);
  EXPECT_EQ(testing::read_file(in), "some text\n");
  // A device node is never an output, and an existing file only with overwrite.
  EXPECT_EQ(testing::exit_code_of([&] { prepare_dataset(*tok, {in}, "/dev/null"); }),
            ExitCode::usage);
  testing::write_file(out, "keep me");
  EXPECT_EQ(testing::exit_code_of([&] { prepare_dataset(*tok, {in}, out); }), ExitCode::usage);
  EXPECT_EQ(testing::read_file(out), "keep me");
  EXPECT_EQ(prepare_dataset(*tok, {in}, out, {.overwrite = true}).tokens, 10);
}

TEST(Prepare, InputsMustBeRegularFiles) {
  TempDir dir;
  auto tok = make_tokenizer("bytes");
  const auto fifo = dir.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Reading a FIFO would block for ever; a directory or a device is no text either.
  for (const std::filesystem::path& in : {fifo, dir.path(), std::filesystem::path("/dev/zero")})
    testing::expect_error(ExitCode::data, in.string() + ": not a regular file", [&] {
      prepare_dataset(*tok, {in}, dir.path() / "o.h5");
    });
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "o.h5"));
}

// Prepares `inputs` under `options` with one thread and with four (more than this machine's cores,
// so they interleave) and expects the same documents, tokens and progress, and the one-thread
// dataset to be each document of split_records over the whole file, encode()d in turn.
void expect_thread_count_independent(const Tokenizer& tok,
                                     const std::vector<std::filesystem::path>& inputs,
                                     PrepareOptions options, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const TokenizerInfo info{tok.name(), tok.vocab_size(), vocabulary_hash(tok)};
  std::vector<int64_t> serial_progress, parallel_progress;
  options.progress = [&](const PrepareProgress& p) { serial_progress.push_back(p.bytes_done); };
  const PrepareStats serial =
      with_threads(1, [&] { return prepare_dataset(tok, inputs, dir / "serial.h5", options); });
  options.progress = [&](const PrepareProgress& p) { parallel_progress.push_back(p.bytes_done); };
  const PrepareStats parallel =
      with_threads(4, [&] { return prepare_dataset(tok, inputs, dir / "parallel.h5", options); });
  EXPECT_EQ(parallel.documents, serial.documents);
  EXPECT_EQ(parallel.tokens, serial.tokens);
  EXPECT_EQ(parallel_progress, serial_progress);
  const TokenDataset a = open_token_dataset(dir / "serial.h5", &info, tok.vocab_size());
  const TokenDataset b = open_token_dataset(dir / "parallel.h5", &info, tok.vocab_size());
  EXPECT_EQ(a.doc_offsets(), b.doc_offsets());
  EXPECT_TRUE(*a.tokens() == *b.tokens());

  const testing::DatasetContents expected = testing::expected_contents(tok, inputs, options.format);
  EXPECT_EQ(a.doc_offsets(), expected.first);
  EXPECT_TRUE(*a.tokens() == expected.second);
}

// gpt2 over files where one thread's batches (4 MB) end after the large file and four threads'
// take every file at once, by lines and by whole files (the large one encoded in parts); a
// tokenizer.json tokenizer (the llama3 fixture) over the small files.
TEST(Prepare, EveryThreadCountWritesWhatOneThreadWrites) {
  TempDir dir;
  const std::string shakespeare = testing::read_file("data/samples/tinyshakespeare.txt");
  std::vector<std::filesystem::path> small, all;
  for (int k = 0; k < 6; ++k) {
    small.push_back(dir.path() / ("part" + std::to_string(k) + ".txt"));
    write_file(small.back(), shakespeare.substr(size_t(k) * 150000, 150000 + size_t(k) * 1000));
    all.push_back(small.back());
    if (k == 2) {
      std::string big;
      while (big.size() < (size_t(5) << 20)) big += shakespeare;
      all.push_back(dir.path() / "big.txt");
      write_file(all.back(), big);
    }
  }
  const auto gpt2 = make_tokenizer("gpt2");
  expect_thread_count_independent(*gpt2, all, {.format = RecordFormat::lines},
                                  dir.path() / "lines");
  expect_thread_count_independent(*gpt2, all, {.format = RecordFormat::file}, dir.path() / "files");
  expect_thread_count_independent(
      *make_tokenizer(std::string(FORGE_SOURCE_DIR) + "/tests/golden/tokenizers/llama3"), small,
      {.format = RecordFormat::lines}, dir.path() / "llama3");
}

// Fails on every document holding "BAD", naming it.
class FailingTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    if (text.find("BAD") != std::string_view::npos)
      throw Error(ExitCode::data, "cannot encode " + std::string(text.substr(0, text.find('\n'))));
    return {1};
  }
  std::string decode(const std::vector<int32_t>&) const override { return ""; }
  int32_t vocab_size() const override { return 2; }
  std::string name() const override { return "failing"; }
};

// An encoding error stops prepare with the first failing document's error, as one thread meets
// it, whichever thread fails first; nothing is written.
TEST(Prepare, AParallelEncodingErrorIsTheFirstDocumentsError) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += (i == 700 || i == 1500 || i == 1900 ? "BAD " : "good ") + std::to_string(i) + "\n";
  write_file(dir.path() / "in.txt", text);
  const FailingTokenizer tok;
  with_threads(4, [&] {
    testing::expect_error(ExitCode::data, "cannot encode BAD 700", [&] {
      prepare_dataset(tok, {dir.path() / "in.txt"}, dir.path() / "o.h5",
                      {.format = RecordFormat::lines});
    });
    return 0;
  });
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "o.h5"));
}

}  // namespace
}  // namespace forge
