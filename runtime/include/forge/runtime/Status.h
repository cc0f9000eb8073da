// Status / Expected: how the runtime reports errors. A bad input (file, data,
// shape) is always a Status with a message naming the problem, never an abort.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace forge::rt {

class [[nodiscard]] Status {
public:
  Status() = default;
  static Status ok() { return Status(); }
  template <typename... Args>
  static Status error(fmt::format_string<Args...> f, Args &&...args) {
    Status s;
    s.message_ = fmt::format(f, std::forward<Args>(args)...);
    return s;
  }
  bool isOk() const { return !message_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const std::string &message() const {
    static const std::string empty;
    return message_ ? *message_ : empty;
  }
  /// Prefixes context ("while loading x: ...").
  Status &prefix(const std::string &context) {
    if (message_)
      message_ = context + ": " + *message_;
    return *this;
  }

private:
  std::optional<std::string> message_;
};

template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : v_(std::move(value)) {}
  Expected(Status status) : v_(std::move(status)) {}
  bool isOk() const { return v_.index() == 0; }
  explicit operator bool() const { return isOk(); }
  T &operator*() { return std::get<0>(v_); }
  const T &operator*() const { return std::get<0>(v_); }
  T *operator->() { return &std::get<0>(v_); }
  const T *operator->() const { return &std::get<0>(v_); }
  Status status() const { return isOk() ? Status::ok() : std::get<1>(v_); }
  T take() { return std::move(std::get<0>(v_)); }

private:
  std::variant<T, Status> v_;
};

#define FORGE_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                   \
    ::forge::rt::Status _st = (expr);                                                    \
    if (!_st.isOk())                                                                     \
      return _st;                                                                        \
  } while (0)

} // namespace forge::rt
