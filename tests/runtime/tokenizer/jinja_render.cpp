// Test helper for test_jinja_vs_python.py: renders many (template file, context) cases with
// lattice's Jinja engine in one process. Reads a JSON file {"now": "YYYY-MM-DD", "cases":
// [{"template": path, "context": {...}}, ...]} (objects keep their key order) and prints a JSON
// array with {"out": text} or {"error": message} per case.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: jinja_render CASES.json\n");
        return 2;
    }
    std::ifstream in(argv[1]);
    const auto spec = nlohmann::ordered_json::parse(in);
    lattice::jinja::RenderOptions opt;
    std::tm tm{};
    if (std::sscanf(spec.at("now").get<std::string>().c_str(), "%d-%d-%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) != 3)
        return 2;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_hour = 12;
    std::mktime(&tm);  // fills tm_wday / tm_yday for %a, %j
    opt.now = tm;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& c : spec.at("cases")) {
        nlohmann::ordered_json r;
        try {
            std::ifstream f(c.at("template").get<std::string>());
            std::stringstream text;
            text << f.rdbuf();
            lattice::jinja::Template t(text.str(), c.at("template").get<std::string>());
            r["out"] = t.render(c.at("context"), opt);
        } catch (const lattice::Error& e) {
            r["error"] = e.message();
        }
        results.push_back(r);
    }
    std::cout << results.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
}
