"""Task metrics and the segment → document aggregation."""
from ernie_doc.metrics.classification import (accuracy, aggregate_segments,  # noqa
                                              classification_metrics, f1_score)
