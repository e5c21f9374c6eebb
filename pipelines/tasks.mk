# Task generation: the training tasks with their corpus, and the held-out test tasks with theirs.
# runs/<RUN>/tasks.parquet, corpus.parquet            (train split)
# runs/<RUN>/test/tasks.parquet, test/corpus.parquet  (test split: entities and numbers never seen in train)

$(RUNDIR)/tasks.parquet $(RUNDIR)/corpus.parquet &: pipelines/default.mk | build
	$(GENERATE) tasks --split train --seed $(SEED) \
	  $(call suite_flags,N) \
	  --corpus-out $(RUNDIR)/corpus.parquet -o $(RUNDIR)/tasks.parquet --stats $(RUNDIR)/stats/tasks.json

$(RUNDIR)/test/tasks.parquet $(RUNDIR)/test/corpus.parquet &: pipelines/default.mk | build
	$(GENERATE) tasks --split test --seed $(TEST_SEED) \
	  $(call suite_flags,TEST_N) \
	  --corpus-out $(RUNDIR)/test/corpus.parquet -o $(RUNDIR)/test/tasks.parquet --stats $(RUNDIR)/stats/test_tasks.json

tasks: $(RUNDIR)/tasks.parquet $(RUNDIR)/test/tasks.parquet
