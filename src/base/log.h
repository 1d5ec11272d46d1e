/* log.h — leveled messages to stderr with the place they came from.
 *
 * Stateless: every message goes to stderr. Debug messages are compiled in
 * only with -DMN_DEBUG. The command-line tools print their results to stdout,
 * so logs never mix with output.
 */
#ifndef MN_LOG_H
#define MN_LOG_H

enum { MN_LOG_DEBUG, MN_LOG_INFO, MN_LOG_WARN, MN_LOG_ERROR };

void mn_log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define LOG_INFO(...) mn_log(MN_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) mn_log(MN_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) mn_log(MN_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#ifdef MN_DEBUG
#define LOG_DEBUG(...) mn_log(MN_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#else
#define LOG_DEBUG(...) ((void)0)
#endif

#endif
