#include "comm/nccl_config.h"

#include <algorithm>
#include <charconv>
#include <fstream>

#include "base/error.h"

namespace mcpp::comm {

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::string our_name(std::string n) {  // Megatron's dp_cp -> our dp-cp
  std::replace(n.begin(), n.end(), '_', '-');
  return n;
}

}  // namespace

NcclConfigs read_nccl_config(const std::string& path) {
  std::ifstream f(path);
  MCPP_CHECK_HINT(bool(f), "pass the path of a YAML file such as docs/parallel.md shows",
                  "--nccl-communicator-config-path: cannot open '{}'", path);
  NcclConfigs out;
  std::string line, group;
  int indent_of_fields = -1;
  for (int no = 1; std::getline(f, line); ++no) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    if (trim(line).empty()) continue;
    const int indent = int(line.find_first_not_of(' '));
    const std::string t = trim(line);
    const auto colon = t.find(':');
    MCPP_CHECK(colon != std::string::npos && colon > 0,
               "{}:{}: expected 'name:' or 'field: integer', got '{}'", path, no, t);
    const std::string key = trim(t.substr(0, colon)), value = trim(t.substr(colon + 1));
    if (indent == 0) {
      MCPP_CHECK(value.empty(), "{}:{}: a group name ('{}:') starts a mapping of fields; put "
                 "'{}' on the next lines, indented", path, no, key, value);
      group = our_name(key);
      out[group];
      indent_of_fields = -1;
      continue;
    }
    MCPP_CHECK(!group.empty(), "{}:{}: field '{}' before any group name", path, no, key);
    if (indent_of_fields < 0) indent_of_fields = indent;
    MCPP_CHECK(indent == indent_of_fields, "{}:{}: inconsistent indentation", path, no);
    int v = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    MCPP_CHECK(ec == std::errc() && p == value.data() + value.size() && v >= 0,
               "{}:{}: '{}' of group '{}' must be a non-negative integer, got '{}'", path, no,
               key, group, value);
    NcclGroupConfig& g = out[group];
    if (key == "cga_cluster_size") g.cga_cluster_size = v;
    else if (key == "max_ctas") g.max_ctas = v;
    else if (key == "min_ctas") g.min_ctas = v;
    else
      MCPP_FAIL("{}:{}: unknown field '{}' of group '{}' (known: cga_cluster_size, max_ctas, "
                "min_ctas)", path, no, key, group);
  }
  for (const auto& [name, g] : out)
    MCPP_CHECK(g.min_ctas < 0 || g.max_ctas < 0 || g.min_ctas <= g.max_ctas,
               "{}: group '{}' has min_ctas {} > max_ctas {}", path, name, g.min_ctas,
               g.max_ctas);
  return out;
}

const NcclGroupConfig* find_nccl_config(const NcclConfigs& c, const std::string& name) {
  auto it = c.find(our_name(name));
  return it == c.end() ? nullptr : &it->second;
}

}  // namespace mcpp::comm
