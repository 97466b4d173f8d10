// maskattn: the command-line front end. Subcommands: attend, grad, gradcheck, audit, example, mask,
// layout, mha, demo, info; each registers itself (add_*_command in its *_command.cc). Every failure
// is one line on stderr and a non-zero exit: 2 for bad command-line syntax, 1 for invalid input
// (maskattn::Error) or any other failure.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "maskattn/error.h"

namespace {

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

int fail(const std::string& message, int code) {
  fmt::print(stderr, "maskattn: error: {}\n", one_line(message));
  return code;
}

// CLI11 would take an unknown first word for a stray positional argument; name it instead.
bool is_unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  for (const CLI::App* command : app.get_subcommands({})) {
    if (command->get_name() == argv[1]) return false;
  }
  return true;
}

// Help and version requests exit 0 with their text; syntax errors exit 2 with one line.
int parse_exit(const CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::Success*>(&error) != nullptr) return app.exit(error);
  return fail(std::string(error.what()) + " (see maskattn --help)", 2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace maskattn::cli;
  CLI::App app{"maskattn: masked scaled-dot-product attention, exact and explained"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "maskattn 0.1.0");
  const std::vector<Command> commands = {
      add_attend_command(app),  add_grad_command(app), add_gradcheck_command(app),
      add_example_command(app), add_mask_command(app), add_layout_command(app),
      add_audit_command(app),   add_mha_command(app),  add_gpt_command(app),
      add_demo_command(app),    add_info_command(app)};
  if (is_unknown_command(app, argc, argv)) {
    return fail(std::string("unknown command '") + argv[1] +
                    "' (commands: attend, grad, gradcheck, audit, example, mask, layout, mha, gpt, "
                    "demo, info; "
                    "see maskattn --help)",
                2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return parse_exit(app, error);
  } catch (const maskattn::Error& error) {  // a flag's value the library's parsers refused
    return fail(std::string(error.what()) + " (see maskattn --help)", 2);
  }
  try {
    for (const Command& command : commands) {
      if (command.subcommand->parsed()) return command.run();
    }
  } catch (const maskattn::Error& error) {
    return fail(error.what(), 1);
  } catch (const std::bad_alloc&) {
    return fail("out of memory: the request needs more memory than is available", 1);
  } catch (const std::exception& error) {
    return fail(error.what(), 1);
  }
  return 1;
}
