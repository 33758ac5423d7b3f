// The registry of `megatron` subcommands. Each lives in src/tools/cmd_<name>.cpp
// and registers itself here, so adding one touches no shared file but this list.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace mcpp::tools {

struct Command {
  std::string name;
  std::function<int(const std::vector<std::string>&)> run;
};

std::vector<Command>& commands();

// Static registration: `static Registrar r{"train", run_train};` in a cmd_*.cpp file.
struct Registrar {
  Registrar(std::string name, std::function<int(const std::vector<std::string>&)> run);
};

}  // namespace mcpp::tools
