// Command registration for the `lattice` executable. Each launch/cmd_*.cpp adds one subcommand:
// it declares its options on `app` and, when chosen, stores the function to run in `run`.
// Only launch/ reads argv and the environment; the functions below it take explicit settings.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace lattice {

using CommandRun = std::function<int()>;

void add_generate_command(CLI::App& app, CommandRun& run);
void add_chat_command(CLI::App& app, CommandRun& run);
void add_score_command(CLI::App& app, CommandRun& run);
void add_info_command(CLI::App& app, CommandRun& run);
void add_tokenize_command(CLI::App& app, CommandRun& run);
void add_doctor_command(CLI::App& app, CommandRun& run);
void add_calibrate_command(CLI::App& app, CommandRun& run);
void add_layout_command(CLI::App& app, CommandRun& run);
void add_plan_command(CLI::App& app, CommandRun& run);
void add_batch_command(CLI::App& app, CommandRun& run);
void add_serve_command(CLI::App& app, CommandRun& run);
void add_convert_command(CLI::App& app, CommandRun& run);
void add_verify_command(CLI::App& app, CommandRun& run);

}  // namespace lattice
