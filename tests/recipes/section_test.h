// What the tests of the recipe sections' typed structs share: every key of a section is set to a
// value other than its default, one config a key, and that value must reach the key's field of the
// struct. A key added to the section without a field (and so without a case here) fails first.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge::testing {

/// The override of a section key ("dpo.beta=0.5"), followed by any others that value needs, and
/// the check that it reached the key's field.
template <class Section>
struct SectionCase {
  std::vector<std::string> overrides;
  std::function<void(const Section&)> check;
};

/// Loads `yaml` (files not checked) once per case with the case's overrides, reads the section with
/// `settings` and runs the case's check; the cases' first overrides must name every key of
/// `section`, and no other.
template <class Section>
void expect_every_key_reaches_its_field(const ConfigSection& section, const std::string& yaml,
                                        Section (*settings)(const RunConfig&),
                                        const std::vector<SectionCase<Section>>& cases) {
  std::set<std::string> keys, named;
  for (const ConfigKey& key : section.keys) keys.insert(key.path);
  for (const SectionCase<Section>& c : cases) {
    const std::string& first = c.overrides.at(0);
    named.insert(first.substr(0, first.find('=')));
    SCOPED_TRACE(first);
    c.check(settings(load_config_string(yaml, "x.yaml", c.overrides, ConfigFiles::skip)));
  }
  EXPECT_EQ(named, keys) << "every key of the " << section.name
                         << ": section needs a field and a case here";
}

}  // namespace forge::testing
