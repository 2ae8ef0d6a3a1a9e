// forge prepare as a pipeline: a reader thread streams the inputs in blocks and cuts them into
// documents and, for a large document, parts its tokenizer encodes apart; kernels::max_threads()
// threads encode chunks of that text, one of them the calling thread, which between chunks writes
// them in the order they were read. What is written depends neither on which thread encoded what
// nor on where the blocks ended, so any thread count and block size give the dataset one thread
// reading whole files gives.
#include "data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "core/kernels/parallel.h"
#include "data/prepare_output.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

bool is_record_separator(std::string_view line) { return line == "%" || line == "%\r"; }

}  // namespace

RecordFormat parse_record_format(const std::string& name) {
  if (name == "file") return RecordFormat::file;
  if (name == "percent") return RecordFormat::percent;
  if (name == "lines") return RecordFormat::lines;
  throw Error(ExitCode::usage,
              "--records: expected file, percent or lines, got '" + name + "'");
}

std::vector<std::string_view> split_records(std::string_view text, RecordFormat format) {
  std::vector<std::string_view> docs;
  auto keep = [&docs](std::string_view d) {
    if (!is_blank(d)) docs.push_back(d);
  };
  if (format == RecordFormat::file) {
    keep(text);
    return docs;
  }
  // Lines, or records ended by a line holding only '%' (the record keeps its final newline).
  size_t begin = 0, pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (format == RecordFormat::lines) {
      keep(line);
    } else if (is_record_separator(line)) {
      keep(text.substr(begin, pos - begin));
      begin = std::min(end + 1, text.size());
    }
    pos = end + 1;
  }
  if (format == RecordFormat::percent) keep(text.substr(begin));
  return docs;
}

int64_t parse_token_count(const std::string& what, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string suffix = text.substr(digits);
  int64_t scale = 0;
  if (suffix.empty()) scale = 1;
  else if (suffix == "k" || suffix == "K") scale = 1000;
  else if (suffix == "M" || suffix == "m") scale = 1000000;
  else if (suffix == "G" || suffix == "g") scale = 1000000000;
  const int64_t value = digits > 0 && digits <= 18 ? std::stoll(text.substr(0, digits)) : 0;
  if (scale == 0 || value == 0 || value > std::numeric_limits<int64_t>::max() / scale)
    throw Error(ExitCode::usage, what + ": expected a positive number of tokens such as 5000, "
                                        "500k, 100M or 2G, got '" + text + "'");
  return value * scale;
}

namespace {

// Text the reader hands on: pieces of it are whole documents, or parts of one in order.
struct Piece {
  size_t begin, end;   // in Chunk::text
  bool ends_document;  // the last part of its document
};

struct Chunk {
  std::string text;
  std::vector<Piece> pieces;
  int64_t bytes_done = 0;  // input bytes up to the end of the last piece
  std::vector<std::vector<int32_t>> ids;  // per piece, from an encoder
  // A failed read, or the first piece that failed to encode (its error, as one thread meets it).
  std::exception_ptr error;
};

// Chunks are numbered as read; the writer takes them by number, so they leave in the order they
// came whichever encoder finished first. At most `max_in_flight` are between reading and writing.
class Pipeline {
 public:
  explicit Pipeline(int64_t max_in_flight) : max_in_flight_(max_in_flight) {}

  // The reader: false once stopped (the writer failed).
  bool push(Chunk chunk) {
    std::unique_lock lock(mutex_);
    space_.wait(lock, [&] { return stopped_ || pushed_ - written_ < max_in_flight_; });
    if (stopped_) return false;
    todo_.emplace_back(pushed_++, std::move(chunk));
    work_.notify_one();
    ready_.notify_one();
    return true;
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    work_.notify_all();
    ready_.notify_all();
  }
  // An encoder: false when there is nothing left to encode.
  bool take(int64_t& number, Chunk& chunk) {
    std::unique_lock lock(mutex_);
    work_.wait(lock, [&] { return stopped_ || closed_ || !todo_.empty(); });
    if (stopped_ || todo_.empty()) return false;
    number = todo_.front().first;
    chunk = std::move(todo_.front().second);
    todo_.pop_front();
    return true;
  }
  void encoded(int64_t number, Chunk chunk) {
    std::lock_guard lock(mutex_);
    encoded_.emplace(number, std::move(chunk));
    if (number == written_) ready_.notify_one();
  }
  // The writer: the next chunk in order to write or, while that one is not encoded yet, a chunk to
  // encode (`to_encode`), so that the writer's thread is an encoder too; false when every chunk
  // was written.
  bool next(int64_t& number, Chunk& chunk, bool& to_encode) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] {
      return encoded_.count(written_) || !todo_.empty() || (closed_ && written_ == pushed_);
    });
    if (auto it = encoded_.find(written_); it != encoded_.end()) {
      chunk = std::move(it->second);
      encoded_.erase(it);
      ++written_;
      space_.notify_one();
      to_encode = false;
      return true;
    }
    if (todo_.empty()) return false;
    number = todo_.front().first;
    chunk = std::move(todo_.front().second);
    todo_.pop_front();
    to_encode = true;
    return true;
  }
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    space_.notify_all();
    work_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable space_, work_, ready_;
  std::deque<std::pair<int64_t, Chunk>> todo_;
  std::map<int64_t, Chunk> encoded_;
  int64_t max_in_flight_, pushed_ = 0, written_ = 0;
  bool closed_ = false, stopped_ = false;
};

// Thrown through the reader when the pipeline stopped under it.
struct ReaderStopped {};

// Streams the inputs into chunks. buf_ holds the text from where the current record's text not
// yet handed on begins (begin_) to what was read last; a record that runs past a block waits there
// for the rest, and one that grows large is handed on in parts as cuts appear in it.
class DocumentReader {
 public:
  DocumentReader(const Tokenizer& tokenizer, const PrepareOptions& options, Pipeline& pipeline)
      : tokenizer_(tokenizer), options_(options), pipeline_(pipeline) {
    next_try_ = 2 * options_.part_bytes;
  }

  // Error(data) naming `file` when it cannot be read or its size is not `size` (changed since
  // it was listed).
  void read(const fs::path& file, int64_t size) {
    const std::string name = quoted_path(file.string());
    // O_NONBLOCK: a FIFO swapped in since the check must not block the open.
    const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
      throw Error(ExitCode::data, name + ": cannot open (" + std::strerror(errno) + ")");
    struct Close {
      int fd;
      ~Close() { ::close(fd); }
    } close{fd};
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    auto read_some = [&](char* into, size_t n) {
      ssize_t got;
      while ((got = ::read(fd, into, n)) < 0 && errno == EINTR) {
      }
      if (got < 0)
        throw Error(ExitCode::data, name + ": read failed (" + std::strerror(errno) + ")");
      return size_t(got);
    };
    for (int64_t left = size; left > 0;) {
      const size_t old = buf_.size();
      buf_.resize(old + size_t(std::min<int64_t>(left, int64_t(options_.block_bytes))));
      const size_t got = read_some(buf_.data() + old, buf_.size() - old);
      buf_.resize(old + got);
      if (got == 0)
        throw Error(ExitCode::data, detail::concat(name, ": ended after ", size - left, " of its ",
                                                   size, " bytes (changed while being read)"));
      left -= int64_t(got);
      max_held_ = std::max(max_held_, int64_t(buf_.capacity()));
      scan(left == 0);
    }
    char extra;
    if (read_some(&extra, 1) > 0)
      throw Error(ExitCode::data, detail::concat(name, ": grew past its ", size,
                                                 " bytes while being read"));
    base_ += int64_t(buf_.size());
    std::string().swap(buf_);  // a large record's buffer is not kept for the files after it
    begin_ = line_ = searched_ = 0;
  }

  // Hands on the last chunk.
  void flush() {
    if (!chunk_.pieces.empty()) push_chunk();
  }

  int64_t max_held() const { return max_held_; }

 private:
  // Hands on the records buf_ completes (all of them at the end of the file), then parts of an
  // unfinished one that has grown.
  void scan(bool at_end) {
    const size_t end = buf_.size();
    if (options_.format != RecordFormat::file) {
      for (size_t nl; (nl = buf_.find('\n', searched_)) != std::string::npos;
           line_ = searched_ = nl + 1) {
        if (options_.format == RecordFormat::lines) {
          record(nl, true);
          begin_ = nl + 1;
        } else if (is_record_separator(std::string_view(buf_).substr(line_, nl - line_))) {
          record(line_, true);
          begin_ = nl + 1;
        }
      }
      searched_ = end;
    }
    if (at_end) {
      if (options_.format == RecordFormat::percent &&
          is_record_separator(std::string_view(buf_).substr(line_))) {
        record(line_, true);
        begin_ = end;
      }
      record(end, true);
      return;
    }
    // Text up to the line not yet ended belongs to this record whatever follows; up to the end
    // of the buffer unless that line may still become a '%' separator.
    const size_t known = options_.format == RecordFormat::percent ? line_ : end;
    if (known - begin_ >= next_try_) {
      record(known, false);
      // A record without cuts is searched again only once it has doubled, so that one the size
      // of the input costs a few passes rather than one per block.
      next_try_ = std::max(2 * (known - begin_), known - begin_ + 2 * options_.part_bytes);
    }
    if (begin_ > 0) {
      buf_.erase(0, begin_);
      base_ += int64_t(begin_);
      line_ -= begin_;
      searched_ -= begin_;
      begin_ = 0;
    }
  }

  // Hands on buf_[begin_, end): the rest of a record when `complete`, else what of it may go now.
  // A large text goes in parts cut where the tokenizer allows; a cut in an unfinished record must
  // have part_bytes of the record after it, the text independent_cuts decides it from.
  void record(size_t end, bool complete) {
    const std::string_view rest = std::string_view(buf_).substr(begin_, end - begin_);
    size_t done = 0;
    if (rest.size() > options_.part_bytes)
      for (size_t cut : tokenizer_.independent_cuts(rest, options_.part_bytes)) {
        if (!complete && cut + options_.part_bytes > rest.size()) break;
        add_piece(rest.substr(done, cut - done), false, begin_ + cut);
        done = cut;
        continued_ = true;
      }
    if (!complete) {
      begin_ += done;
      return;
    }
    if (continued_ || !is_blank(rest.substr(done))) add_piece(rest.substr(done), true, end);
    continued_ = false;
    next_try_ = 2 * options_.part_bytes;
  }

  void add_piece(std::string_view text, bool ends_document, size_t end) {
    chunk_.pieces.push_back({chunk_.text.size(), chunk_.text.size() + text.size(), ends_document});
    chunk_.text.append(text);
    chunk_.bytes_done = base_ + int64_t(end);
    if (chunk_.text.size() >= options_.chunk_bytes) push_chunk();
  }

  void push_chunk() {
    if (!pipeline_.push(std::move(chunk_))) throw ReaderStopped{};
    chunk_ = Chunk();
  }

  const Tokenizer& tokenizer_;
  const PrepareOptions& options_;
  Pipeline& pipeline_;
  std::string buf_;
  size_t begin_ = 0;     // the record's text not yet handed on starts here
  size_t line_ = 0;      // the first line not yet ended starts here
  size_t searched_ = 0;  // buf_ holds no '\n' in [line_, searched_)
  size_t next_try_;      // cut the unfinished record once this much of it is known
  bool continued_ = false;  // parts of the current record were handed on
  int64_t base_ = 0;        // input bytes before buf_
  int64_t max_held_ = 0;
  Chunk chunk_;
};

void encode_chunk(const Tokenizer& tokenizer, Chunk& chunk) {
  if (chunk.error) return;
  chunk.ids.resize(chunk.pieces.size());
  for (size_t i = 0; i < chunk.pieces.size(); ++i) {
    const Piece& p = chunk.pieces[i];
    try {
      const std::string_view text(chunk.text.data() + p.begin, p.end - p.begin);
      chunk.ids[i] = tokenizer.encode(text);
    } catch (...) {
      chunk.error = std::current_exception();
      return;
    }
  }
}

// Sizes of `inputs`, each checked to be a readable regular file.
std::vector<int64_t> input_sizes(const std::vector<fs::path>& inputs) {
  std::vector<int64_t> sizes;
  for (const fs::path& in : inputs) {
    const std::string name = quoted_path(in.string());
    std::error_code ec;
    const fs::file_status status = fs::status(in, ec);
    if (!fs::exists(status)) throw Error(ExitCode::data, name + ": no such file");
    // A FIFO or a device would block or never end; only files have a size to read.
    if (!fs::is_regular_file(status)) throw Error(ExitCode::data, name + ": not a regular file");
    const auto size = fs::file_size(in, ec);
    if (ec || ::access(in.c_str(), R_OK) != 0)
      throw Error(ExitCode::data, name + ": cannot read (" +
                                      (ec ? ec.message() : std::strerror(errno)) + ")");
    sizes.push_back(int64_t(size));
  }
  return sizes;
}

}  // namespace

PrepareStats prepare_dataset(const Tokenizer& tokenizer, const std::vector<fs::path>& inputs,
                             const fs::path& output_path, const PrepareOptions& options) {
  FORGE_CHECK(options.block_bytes > 0 && options.chunk_bytes > 0 && options.part_bytes > 0,
              "prepare_dataset: block, chunk and part sizes must be positive");
  FORGE_CHECK(options.shard_tokens >= 0, "prepare_dataset: negative shard_tokens");
  const std::vector<int64_t> sizes = input_sizes(inputs);
  // "out/" names the directory "out", whose hidden partial sibling is ".out.partial-PID".
  const fs::path output = output_path.has_filename() ? output_path : output_path.parent_path();
  check_prepare_output(output, inputs, options.shard_tokens > 0, options.overwrite);

  PrepareStats stats;
  stats.files = int64_t(inputs.size());
  for (int64_t size : sizes) stats.bytes += size;
  stats.threads = std::max(1, kernels::max_threads());
  PreparedOutput out(output, {tokenizer.name(), tokenizer.vocab_size(), vocabulary_hash(tokenizer)},
                     options.shard_tokens);

  // Two chunks per encoder keep every one busy while the writer catches up. The writer encodes
  // too: writing is a tenth of the work, which one more thread would leave a core idle for.
  Pipeline pipeline(2 * stats.threads + 2);
  DocumentReader reader(tokenizer, options, pipeline);
  std::vector<std::thread> threads;
  struct Join {
    Pipeline& pipeline;
    std::vector<std::thread>& threads;
    ~Join() {
      pipeline.stop();
      for (std::thread& t : threads) t.join();
    }
  } join{pipeline, threads};
  threads.emplace_back([&] {
    try {
      for (size_t i = 0; i < inputs.size(); ++i) reader.read(inputs[i], sizes[i]);
      reader.flush();
    } catch (const ReaderStopped&) {
    } catch (...) {
      Chunk failed;
      failed.error = std::current_exception();
      pipeline.push(std::move(failed));
    }
    pipeline.close();
  });
  for (int64_t t = 1; t < stats.threads; ++t)
    threads.emplace_back([&] {
      int64_t number;
      Chunk chunk;
      while (pipeline.take(number, chunk)) {
        encode_chunk(tokenizer, chunk);
        pipeline.encoded(number, std::move(chunk));
      }
    });

  std::vector<int32_t> document;  // the parts so far of a document cut into parts
  Chunk chunk;
  int64_t number;
  bool to_encode;
  while (pipeline.next(number, chunk, to_encode)) {
    if (to_encode) {
      encode_chunk(tokenizer, chunk);
      pipeline.encoded(number, std::move(chunk));
      continue;
    }
    if (chunk.error) std::rethrow_exception(chunk.error);
    for (size_t i = 0; i < chunk.pieces.size(); ++i) {
      const std::vector<int32_t>& ids = chunk.ids[i];
      stats.tokens += int64_t(ids.size());
      if (!chunk.pieces[i].ends_document || !document.empty())
        document.insert(document.end(), ids.begin(), ids.end());
      if (!chunk.pieces[i].ends_document) continue;
      out.add_document(document.empty() ? ids : document);
      std::vector<int32_t>().swap(document);
      stats.documents++;
    }
    if (options.progress)
      options.progress({chunk.bytes_done, stats.bytes, stats.documents, stats.tokens});
  }
  out.finish();
  stats.shards = out.shards();
  stats.max_held_bytes = reader.max_held();
  if (options.progress) options.progress({stats.bytes, stats.bytes, stats.documents, stats.tokens});
  return stats;
}

namespace {

// 1234567 -> "1.23M": counts and rates at a glance.
std::string short_count(double n) {
  char text[32];
  if (n >= 1e9) std::snprintf(text, sizeof text, "%.2fG", n / 1e9);
  else if (n >= 1e6) std::snprintf(text, sizeof text, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(text, sizeof text, "%.1fk", n / 1e3);
  else std::snprintf(text, sizeof text, "%.0f", n);
  return text;
}

std::string duration(double seconds) {
  const auto s = (long long)(seconds + 0.5);
  char text[32];
  if (s >= 3600) std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else if (s >= 60) std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(text, sizeof text, "%llds", s);
  return text;
}

}  // namespace

void PrepareProgressPrinter::update(const PrepareProgress& p, double seconds) {
  const int64_t tenth = p.bytes_total > 0 ? 10 * p.bytes_done / p.bytes_total : 10;
  if (terminal_ ? last_seconds_ >= 0 && seconds - last_seconds_ < 0.25
                : tenth <= last_tenth_ && seconds - std::max(last_seconds_, 0.0) < 30)
    return;
  last_seconds_ = seconds;
  last_tenth_ = std::max(last_tenth_, tenth);
  const double elapsed = std::max(seconds, 1e-9);
  const double bytes_per_s = double(p.bytes_done) / elapsed;
  const std::string eta =
      bytes_per_s > 0 ? duration(double(p.bytes_total - p.bytes_done) / bytes_per_s) : "?";
  std::fprintf(out_,
               "%sprepare: %.1f/%.1f MB (%lld%%), %s tokens, %.1f MB/s, %s tokens/s, ETA %s%s",
               terminal_ ? "\r" : "", double(p.bytes_done) / 1e6, double(p.bytes_total) / 1e6,
               (long long)(p.bytes_total > 0 ? 100 * p.bytes_done / p.bytes_total : 100),
               short_count(double(p.tokens)).c_str(), bytes_per_s / 1e6,
               short_count(double(p.tokens) / elapsed).c_str(), eta.c_str(),
               terminal_ ? "\x1b[K" : "\n");
  std::fflush(out_);
  line_open_ = terminal_;
}

void PrepareProgressPrinter::finish(const PrepareStats& stats, double seconds) {
  const double elapsed = std::max(seconds, 1e-9);
  std::fprintf(out_, "%sprepare: %s tokens from %.1f MB in %.1f s: %.1f MB/s, %s tokens/s "
               "(%lld thread%s)\n",
               line_open_ ? "\r\x1b[K" : "", short_count(double(stats.tokens)).c_str(),
               double(stats.bytes) / 1e6, seconds, double(stats.bytes) / 1e6 / elapsed,
               short_count(double(stats.tokens) / elapsed).c_str(), (long long)stats.threads,
               stats.threads == 1 ? "" : "s");
  std::fflush(out_);
  line_open_ = false;
}

}  // namespace forge
