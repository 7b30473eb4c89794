#include "options.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>

namespace conv2d_ext {

namespace {

struct Entry {
  const char* name;
  bool default_value;
};

constexpr std::array<Entry, 25> kEntries{{
    {"poison_outputs", false},
    {"hopper_kernels", true},
    {"flat_kernels", true},
    {"short_wgrad_direct", true},
    {"few_channels_wgrad_sm90", true},
    {"few_channels_dgrad_tc", true},
    {"few_channels_dgrad_pairs", true},
    {"few_channels_dgrad_order", true},
    {"few_channels_dgrad_wide", true},
    {"wgrad_edge_steps", true},
    {"nhwc_kernels", true},
    {"nhwc_wgrad", true},
    {"nhwc_wgmma", true},
    {"nhwc_split_k", true},
    {"nhwc_wide_tiles", false},
    {"cpu_avx512", true},
    {"cpu_avx2", true},
    {"nhwc_tf32_truncate", false},
    {"nhwc_16bit", true},
    {"nhwc_ieee_wgrad", true},
    {"nhwc_copies", true},
    {"dgrad_phase_streams", false},
    {"nhwc_ieee", false},
    {"nhwc_wgmma_pipelined", false},
    {"nhwc_ieee_half_parts", false},
}};
static_assert(static_cast<int>(Option::kNhwcIeeeHalfParts) + 1 == kEntries.size(),
              "one entry per Option, in the enum's order");

struct Values {
  std::atomic<bool> v[kEntries.size()];
  Values() {
    for (size_t i = 0; i < kEntries.size(); ++i) v[i].store(kEntries[i].default_value);
  }
};

std::atomic<bool>* values() {
  static Values values;
  return values.v;
}

}  // namespace

bool option(Option o) {
  return values()[static_cast<size_t>(o)].load(std::memory_order_relaxed);
}

bool set_option(const std::string& name, bool value) {
  for (size_t i = 0; i < kEntries.size(); ++i) {
    if (name == kEntries[i].name) return values()[i].exchange(value);
  }
  std::string known;
  for (const Entry& e : kEntries) known += std::string(known.empty() ? "" : ", ") + e.name;
  TORCH_CHECK(false, "conv2d_ext: unknown option '", name, "' (known: ", known, ")");
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const Entry& e : kEntries) names.emplace_back(e.name);
  return names;
}

}  // namespace conv2d_ext
