// printable(): every error and warning forge prints is one line that cannot drive the terminal,
// whatever bytes it quotes (a corrupt file's contents, a user's string with a newline).
#include <gtest/gtest.h>

#include "core/error.h"

namespace forge {
namespace {

TEST(Printable, EscapesControlCharactersAndKeepsPrintableText) {
  EXPECT_EQ(printable("runs/x: step 3"), "runs/x: step 3");
  EXPECT_EQ(printable("a\nb\r\tc"), "a\\nb\\r\\tc");
  EXPECT_EQ(printable("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");
  EXPECT_EQ(printable(std::string("nul\0byte", 8)), "nul\\x00byte");
}

TEST(Printable, KeepsUtf8AndEscapesInvalidBytesAndC1Controls) {
  EXPECT_EQ(printable("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(printable("cut \xe6\x97"), "cut \\xe6\\x97");        // a sequence cut short
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                // an overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");       // a surrogate
  EXPECT_EQ(printable("csi \xc2\x9b" "2J"), "csi \\xc2\\x9b2J");  // U+009B, the C1 CSI
  EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");                  // U+00A0 is printable
}

}  // namespace
}  // namespace forge
