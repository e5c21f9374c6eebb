# Task generation: the training tasks with their corpus, and the held-out test tasks with theirs.
# runs/<RUN>/tasks.parquet, corpus.parquet            (train split)
# runs/<RUN>/test/tasks.parquet, test/corpus.parquet  (test split: entities and numbers never seen in train)

$(RUNDIR)/tasks.parquet $(RUNDIR)/corpus.parquet &: pipelines/default.mk | build
	$(GENERATE) tasks --split train --seed $(SEED) \
	  --suite multihop --n $(N_MULTIHOP) --suite math --n $(N_MATH) --suite code --n $(N_CODE) \
	  --corpus-out $(RUNDIR)/corpus.parquet -o $(RUNDIR)/tasks.parquet --stats $(RUNDIR)/stats/tasks.json

$(RUNDIR)/test/tasks.parquet $(RUNDIR)/test/corpus.parquet &: pipelines/default.mk | build
	$(GENERATE) tasks --split test --seed $(TEST_SEED) \
	  --suite multihop --n $(TEST_N_MULTIHOP) --suite math --n $(TEST_N_MATH) --suite code --n $(TEST_N_CODE) \
	  --corpus-out $(RUNDIR)/test/corpus.parquet -o $(RUNDIR)/test/tasks.parquet --stats $(RUNDIR)/stats/test_tasks.json

tasks: $(RUNDIR)/tasks.parquet $(RUNDIR)/test/tasks.parquet
