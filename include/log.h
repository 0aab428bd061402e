/* log.h: leveled logging to stderr, shared by every pvisor program. */
#ifndef PVISOR_LOG_H
#define PVISOR_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Program name shown in every line, and the most verbose level printed. */
void log_init(const char *prog, enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* "error", "warn", "info", "debug" -> level; -EINVAL for anything else. */
int log_level_parse(const char *s);

void log_msg(enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_err(...)   log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* For main() only: print the message at error level and exit(status). */
void log_die(int status, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

#endif
