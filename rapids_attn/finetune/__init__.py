"""Fine-tuning a model for the task before its heads are analysed (issue 37), on HuggingFace's ``Trainer``:
extractive QA on SQuAD-format data (:mod:`rapids_attn.finetune.qa`), sequence classification on a label
(:mod:`rapids_attn.finetune.classify`), and the train/evaluation split by article (:mod:`rapids_attn.finetune.split`)."""
