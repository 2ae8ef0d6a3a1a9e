// read_input_file and read_first_line: only regular files, never blocking on a FIFO, within a size limit, with the
// exit code of the kind of input and the path escaped into one line.
#include <sys/stat.h>

#include "core/durable_file.h"
#include "core/file_io.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

constexpr InputKind kSmall{"test input", 16, ExitCode::data};

TEST(FileIO, ReadsARegularFileWhole) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "a.txt", "hello\nworld");
  EXPECT_EQ(read_input_file((dir.path() / "a.txt").string(), kSmall), "hello\nworld");
}

TEST(FileIO, DevicesDirectoriesAndFifosAreNotRegularFiles) {
  testing::TempDir dir;
  const std::string fifo = (dir.path() / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens the FIFO: a reader that opened it blocking would hang here.
  for (const std::string& path : {std::string("/dev/zero"), dir.path().string(), fifo})
    testing::expect_error(ExitCode::data, path + ": not a regular file",
                          [&] { read_input_file(path, kSmall); });
  testing::expect_error(ExitCode::usage, "forge: config error: /dev/zero: not a regular file",
                        [&] { read_input_file("/dev/zero", kConfigInput); });
}

// LATEST and digest sidecars: a FIFO or device planted in their place reads as unreadable ("")
// rather than hanging the process or reading forever.
TEST(FileIO, FirstLineOfOnlyARegularFile) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "LATEST", "step-000010.h5 crc32:01234567:99 \nmore\n");
  EXPECT_EQ(read_first_line(dir.path() / "LATEST"), "step-000010.h5 crc32:01234567:99");
  const fs::path fifo = dir.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_first_line(fifo), "");
  EXPECT_EQ(read_first_line("/dev/zero"), "");
  EXPECT_EQ(read_first_line(dir.path() / "missing"), "");
}

TEST(FileIO, SizeLimitIsNamed) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "big.txt", std::string(17, 'x'));
  testing::expect_error(ExitCode::data, "big.txt: 17 bytes, more than the test input limit of 16 bytes",
                        [&] { read_input_file((dir.path() / "big.txt").string(), kSmall); });
  testing::write_file(dir.path() / "fits.txt", std::string(16, 'x'));
  EXPECT_EQ(read_input_file((dir.path() / "fits.txt").string(), kSmall).size(), 16u);
}

TEST(FileIO, MissingFileAndControlCharactersInTheName) {
  testing::TempDir dir;
  testing::expect_error(ExitCode::data, "nope\\nx\\x01.txt: file not found", [&] {
    read_input_file((dir.path() / "nope\nx\x01.txt").string(), kSmall);
  });
  EXPECT_EQ(quoted_path("a\tb\\c\x7f"), "a\\tb\\\\c\\x7f");
}

}  // namespace
}  // namespace forge
