// Typed reads of config.json fields, shared by the config parser (config.cpp) and the family entries
// whose options have keys of their own (runtime/arch/family_*.cpp): integers must be JSON integers
// (64.9 is refused, not truncated; 64.0 passes), numbers finite, and the type must match; every
// refusal names the source and the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace lattice::config_json {

// The value of j[key] as T. Integers must be JSON integers (64.9 is refused, not truncated; 64.0
// passes), numbers must be finite, and the type must match.
template <typename T>
inline T get_value(const nlohmann::json& j, const char* key, const std::string& src) {
    const nlohmann::json& v = j[key];
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        if (v.is_number_float()) {
            const double d = v.get<double>();
            LATTICE_CHECK(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15,
                          "{}: field \"{}\" must be an integer, got {}", src, key, v.dump());
            return T(d);
        }
        LATTICE_CHECK(v.is_number_integer(), "{}: field \"{}\" must be an integer, got {}", src, key,
                      v.dump().substr(0, 64));
        LATTICE_CHECK(v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT64_MAX) : true,
                      "{}: field \"{}\" = {} is out of range", src, key, v.dump());
    }
    if constexpr (std::is_floating_point_v<T>)
        LATTICE_CHECK(v.is_number(), "{}: field \"{}\" must be a number, got {}", src, key, v.dump().substr(0, 64));
    try {
        return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: field \"{}\" has the wrong type ({})", src, key, e.what());
    }
}

template <typename T>
inline T get_required(const nlohmann::json& j, const char* key, const std::string& src) {
    LATTICE_CHECK(j.contains(key) && !j[key].is_null(), "{}: missing required field \"{}\"", src, key);
    return get_value<T>(j, key, src);
}

template <typename T>
inline T get_optional(const nlohmann::json& j, const char* key, T fallback, const std::string& src) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return get_value<T>(j, key, src);
}

}  // namespace lattice::config_json
