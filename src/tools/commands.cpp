#include "tools/commands.h"

namespace mcpp::tools {

std::vector<Command>& commands() {
  static std::vector<Command> c;
  return c;
}

Registrar::Registrar(std::string name, std::function<int(const std::vector<std::string>&)> run) {
  commands().push_back({std::move(name), std::move(run)});
}

}  // namespace mcpp::tools
