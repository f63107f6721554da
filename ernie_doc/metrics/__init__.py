"""Task metrics and the segment → document aggregation."""
from ernie_doc.metrics.classification import (accuracy, aggregate_segments, f1_score,  # noqa
                                              classification_metrics)
