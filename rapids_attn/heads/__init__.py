"""Which heads matter (issue 14): head ablation and gates (``hooks``), task metrics (``metrics``),
head-wise probing (``probe``), pruning curves and the ``heads`` stage that runs them over the dataset."""
