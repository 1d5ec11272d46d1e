/* stats.h — order statistics of a handful of doubles.
 *
 * The median of recent measurements is what the scheduler (the decodes'
 * own time), the disk probe and the bench report go by: one sort, one
 * comparison function, here.
 */
#ifndef MN_STATS_H
#define MN_STATS_H

/* Sort v[0..n) ascending, in place. */
void mn_sort_doubles(double *v, long n);

/* The median of v[0..n) (n > 0; the mean of the middle two for even n),
 * sorting v in place. */
double mn_median_sort(double *v, long n);

#endif
