// The renderer that test_jinja_vs_python.py drives (the comparison with jinja2 and its verdicts are there):
// renders many (template file, context) cases with lattice's Jinja engine in one process. Reads a JSON
// file {"now": "YYYY-MM-DD", "cases": [{"template": path, "context": {...}}, ...]} (objects keep their key
// order) and prints a JSON array with {"out": text} or {"error": message} per case, one per case in order.
// A render's error is a result to compare; input that is not what the script writes (no file, a "now" that
// is no date, no "cases" array, a template file that cannot be read) is the harness's fault: it exits 2
// naming it, rather than print results that would compare an empty or missing template.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"

namespace {

std::string read_template(const std::string& path) {
    std::ifstream f(path);
    LATTICE_CHECK(f.good(), "template {}: cannot open it", path);
    std::stringstream text;
    text << f.rdbuf();
    return text.str();
}

// "now" (YYYY-MM-DD) at noon, with the week and year days strftime's %a and %j read.
std::tm noon_of(const std::string& date) {
    std::tm tm{};
    LATTICE_CHECK(std::sscanf(date.c_str(), "%d-%d-%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday) == 3,
                  "\"now\" {}: not YYYY-MM-DD", date);
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_hour = 12;
    std::mktime(&tm);  // fills tm_wday / tm_yday for %a, %j
    return tm;
}

int render_all(const char* spec_path) {
    std::ifstream in(spec_path);
    LATTICE_CHECK(in.good(), "{}: cannot open it", spec_path);
    const auto spec = nlohmann::ordered_json::parse(in);
    LATTICE_CHECK(spec.contains("cases") && spec["cases"].is_array(), "{}: no \"cases\" array", spec_path);
    lattice::jinja::RenderOptions opt;
    opt.now = noon_of(spec.at("now").get<std::string>());
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& c : spec["cases"]) {
        const std::string path = c.at("template").get<std::string>();
        const std::string text = read_template(path);
        nlohmann::ordered_json r;
        try {
            lattice::jinja::Template t(text, path);
            r["out"] = t.render(c.at("context"), opt);
        } catch (const lattice::Error& e) {
            r["error"] = e.message();
        }
        results.push_back(r);
    }
    std::cout << results.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: jinja_render CASES.json\n");
        return 2;
    }
    try {
        return render_all(argv[1]);
    } catch (const std::exception& e) {  // lattice::Error, or the JSON library's on a malformed spec
        std::fprintf(stderr, "jinja_render: %s\n", e.what());
        return 2;
    }
}
